"""`sagequeue local` (the whole stack on localhost, in the foreground) and `sagequeue demo`."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

import click

from sagequeue.queue_cli import EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE

_CAPACITY_HELP = "Instances of a pool, TYPE=N (repeatable), e.g. --capacity ml.trn1.32xlarge=2."


def _parse_pairs(values: tuple[str, ...], what: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for value in values:
        key, sep, item = value.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{value!r} is not {what}")
        pairs[key.strip()] = item.strip()
    return pairs


def _capacity(values: tuple[str, ...]) -> dict[str, int]:
    capacity = {}
    for instance_type, count in _parse_pairs(values, "TYPE=N (e.g. ml.trn1.32xlarge=2)").items():
        if not count.isdigit():
            raise click.BadParameter(f"{instance_type}={count}: N must be a whole number of instances")
        capacity[instance_type] = int(count)
    return capacity


def _settings(
    capacity: tuple[str, ...], allowed_roles: tuple[str, ...], admins: tuple[str, ...], extra: tuple[str, ...]
) -> dict[str, Any]:
    settings: dict[str, Any] = dict(_parse_pairs(extra, "NAME=VALUE (e.g. max_attempts=3)"))
    if capacity:
        settings["capacity"] = _capacity(capacity)
    if allowed_roles:
        settings["allowed_role_arns"] = list(allowed_roles)
    if admins:
        settings["admin_role_arns"] = list(admins)
    return settings


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (it holds secret keys), never readable by others meanwhile."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
    path.chmod(0o600)


def _keep_for_good() -> None:
    """What a started stack holds (modules, service models, moto's backends: most of the process's
    objects) lives until the process ends, so the collector stops walking it: every later collection, and
    the one at exit (most of a second after the demo), sees only what the stack makes from then on."""
    import gc

    gc.freeze()


def _fail(message: str, code: int = EXIT_REFUSED) -> NoReturn:
    """One line on stderr, and the exit code of docs/client.md's table (the queue commands' own)."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


class _StackLock:
    """One `sagequeue local` per home: an exclusive lock on `<home>/local.lock`, held while the stack runs.

    The lock is the kernel's (flock): it goes with the process, so a stack that was killed leaves no stale
    lock behind, and two stacks starting at once cannot both win."""

    def __init__(self, home: Path) -> None:
        self.path = home / "local.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        import fcntl

        from sagequeue.config import load_local_connection

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            try:
                saved = load_local_connection(self.path.parent / "local.json")
            except Exception:  # noqa: BLE001 - the message names the PID either way
                saved = None
            url = saved.endpoint if saved is not None else "not serving yet"
            raise click.ClickException(
                f"another sagequeue local (PID {holder}, {url}) runs on {self.path.parent}; stop it, or "
                "give this one a home of its own with SAGEQUEUE_HOME=DIR"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the lock
            self._fd = None


@click.group("local", invoke_without_command=True)
@click.pass_context
@click.option("--capacity", "-c", multiple=True, metavar="TYPE=N", help=_CAPACITY_HELP)
@click.option(
    "--port",
    "-p",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="API port (0: any free port).",
)
@click.option(
    "--speed",
    type=click.FloatRange(min=0.001),
    default=1.0,
    show_default=True,
    help="Clock speed: 60 makes a minute pass in a second.",
)
@click.option(
    "--allowed-role",
    "allowed_roles",
    multiple=True,
    metavar="ARN",
    help="A role submitted jobs may pass (repeatable); default: the stack's local training role.",
)
@click.option(
    "--admin",
    "admins",
    multiple=True,
    metavar="ARN",
    help="A principal that may change any job (repeatable); the local admin identity always is.",
)
@click.option(
    "--setting",
    "-s",
    "extra",
    multiple=True,
    metavar="NAME=VALUE",
    help="Any other setting, by its stack parameter name in snake_case (repeatable).",
)
@click.option(
    "--function-logs/--no-function-logs",
    default=False,
    show_default=True,
    help="Print the functions' logs and metric documents.",
)
@click.option(
    "--template",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The SAM template to run (default: the project's template.yaml).",
)
@click.option(
    "--state",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="PATH",
    help="Keep the queue across restarts: restore the tables from PATH at start, save them there at stop.",
)
def local(
    ctx: click.Context,
    capacity: tuple[str, ...],
    port: int,
    speed: float,
    allowed_roles: tuple[str, ...],
    admins: tuple[str, ...],
    extra: tuple[str, ...],
    function_logs: bool,
    template: Path | None,
    state: Path | None,
) -> None:
    """Run sagequeue's whole stack on localhost until Ctrl-C: the API, the scheduler and the governance
    functions on moto and the SageMaker emulator, on the real clock (optionally faster).

    Without --state the queue lives as long as the stack. One stack runs per home (SAGEQUEUE_HOME): a
    second one refuses to start. `sagequeue local env` prints what a client needs, as shell exports.
    """
    if ctx.invoked_subcommand is not None:
        return
    from sagequeue.config import (
        local_connection_path,
        remove_local_connection,
        sagequeue_home,
        save_local_connection,
    )
    from sagequeue.local.stack import LocalStack, LocalStackError

    settings = _settings(capacity, allowed_roles, admins, extra)
    lock = _StackLock(sagequeue_home())
    try:
        lock.acquire()
    except click.ClickException as exc:
        _fail(exc.message)
    try:
        stack = LocalStack(
            settings=settings,
            clock="real",
            speed=speed,
            port=port,
            template=template,
            function_logs=function_logs,
            state=state,
        )
    except (LocalStackError, ValueError) as exc:
        lock.release()
        _fail(str(exc))
    stopping = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            stack.start()
        except (LocalStackError, ValueError, OSError) as exc:
            _fail(f"the local stack did not start: {exc}")
        _keep_for_good()
        connection = stack.connection()
        saved = save_local_connection(connection)
        identities_file = saved.parent / "local-identities.json"
        _write_private(identities_file, json.dumps(stack.identities.to_dict(), indent=2) + "\n")
        click.echo(_banner(stack, saved, identities_file))
        sys.stdout.flush()
        notices = _NoticeWatch(stack)
        while not stopping.wait(0.5):
            for line in notices.lines():
                click.echo(line)
            sys.stdout.flush()
        click.echo("\nstopping the local stack...")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        endpoint = stack.endpoint if stack._api is not None else None
        try:
            stack.stop()
        finally:
            if endpoint is not None:
                remove_local_connection(local_connection_path(), endpoint=endpoint)
            lock.release()
    if state is not None:
        click.echo(f"saved the queue to {state}")
    click.echo("stopped.")


class _NoticeWatch:
    """The terminal's own subscriber to the stack's job notices: every notice, as a line."""

    def __init__(self, stack: Any) -> None:
        self.sqs = stack.aws_client("sqs")
        self.url: str | None = None
        topic = stack.spec.outputs.get("JobNoticesTopicArn") if stack.spec else None
        if not topic:
            return  # a template without notices
        self.url = self.sqs.create_queue(QueueName="sagequeue-local-terminal-notices")["QueueUrl"]
        arn = self.sqs.get_queue_attributes(QueueUrl=self.url, AttributeNames=["QueueArn"])["Attributes"]
        stack.aws_client("sns").subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn["QueueArn"])

    def lines(self) -> list[str]:
        if self.url is None:
            return []
        out = []
        for message in self.sqs.receive_message(QueueUrl=self.url, MaxNumberOfMessages=10).get(
            "Messages", []
        ):
            self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle=message["ReceiptHandle"])
            try:
                envelope = json.loads(message["Body"])
                owner = envelope["MessageAttributes"]["owner"]["Value"]
                out.append(f"notice: {envelope['Subject']} (owner {owner.rsplit('/', 1)[-1]})")
            except (ValueError, KeyError, TypeError):
                continue
        return out


@local.command("env")
@click.option(
    "--identity",
    "-i",
    default="user",
    show_default=True,
    metavar="NAME",
    help="Whose keys to export: user, other or admin (the names the start-up printout lists).",
)
def local_env(identity: str) -> None:
    """Print shell `export` lines for the running local stack: its API endpoint, region, the identity's
    keys, the SageMaker emulator's URL (AWS_ENDPOINT_URL_SAGEMAKER, which boto3 and the SageMaker SDK
    follow) and the stack's S3 and SNS (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL_SNS, which `sagequeue cache` and
    `sagequeue notify` follow too). Use:
    eval "$(sagequeue local env)"."""
    import shlex

    from sagequeue.config import ENDPOINT_ENV, load_local_connection, local_connection_path
    from sagequeue.exceptions import ConfigurationError

    path = local_connection_path()
    try:
        saved = load_local_connection(path)
    except ConfigurationError as exc:
        _fail(str(exc), EXIT_UNREACHABLE)
    # no stack to export is the queue that cannot be located: exit 3, as `sagequeue ls` says it
    if saved is None:
        _fail(
            f"no local stack runs on this home: {path} does not exist (start one with `sagequeue local`)",
            EXIT_UNREACHABLE,
        )
    if saved.pid is not None and not _alive(saved.pid):
        _fail(
            f"the local stack that saved {path} (PID {saved.pid}) is gone; start one with `sagequeue local`",
            EXIT_UNREACHABLE,
        )
    key, secret = saved.access_key_id, saved.secret_access_key
    if identity != "user":
        keys = _identity_keys(path.parent / "local-identities.json", identity)
        key, secret = keys
    values = [
        (ENDPOINT_ENV, saved.endpoint),
        ("AWS_ACCESS_KEY_ID", key),
        ("AWS_SECRET_ACCESS_KEY", secret),
        ("AWS_REGION", saved.region),
        ("AWS_DEFAULT_REGION", saved.region),
    ]
    if saved.sagemaker_endpoint:
        values.append(("AWS_ENDPOINT_URL_SAGEMAKER", saved.sagemaker_endpoint))
    if saved.aws_endpoint:
        # `sagequeue cache`, `sagequeue notify` and boto3 then use the stack's S3 and SNS, not the real ones
        values.append(("AWS_ENDPOINT_URL_S3", saved.aws_endpoint))
        values.append(("AWS_ENDPOINT_URL_SNS", saved.aws_endpoint))
    # a session token or a profile left from real AWS would be sent with, or chosen over, these keys
    click.echo("unset AWS_SESSION_TOKEN AWS_PROFILE")
    for name, value in values:
        click.echo(f"export {name}={shlex.quote(value)}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _identity_keys(path: Path, name: str) -> tuple[str, str]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        _fail(f"cannot read the local identities in {path}: {exc}", EXIT_UNREACHABLE)
    entries = document if isinstance(document, dict) else {}
    entry = entries.get(name)
    if isinstance(entry, dict) and entry.get("access_key_id") and entry.get("secret_access_key"):
        return str(entry["access_key_id"]), str(entry["secret_access_key"])
    found = sorted(str(n) for n in entries)
    _fail(f"no local identity named {name!r}; known: {', '.join(found) or 'none'}", EXIT_USAGE)


def _banner(stack: Any, saved: Path, identities_file: Path) -> str:
    settings = stack.settings
    pools = ", ".join(f"{t}={n}" for t, n in settings.capacity.items()) or "none yet (PUT /pools as admin)"
    user = stack.identity("user")
    admin = stack.identity("admin")
    lines = [
        f"sagequeue local stack up in {stack.startup_seconds:.1f} s",
        f"  API endpoint      {stack.endpoint}   (region {stack.region}, SigV4 service execute-api)",
        f"  SageMaker         {stack.emulator.endpoint_url}   (the emulator)",
        f"  AWS services      {stack.moto_endpoint}   (moto: DynamoDB, EventBridge, SNS, SQS, CloudWatch, S3)",
        f"  pools             {pools}",
        f"  training role     {stack.training_role_arn}   (jobs must pass an allowed role)",
        f"  clock             {stack.clock!r}",
        "",
        f"Saved the connection to {saved}; the CLI and the SDK in other terminals use it:",
        "  sagequeue submit job.json     sagequeue ls     sagequeue pools     sagequeue whoami",
        "",
        "Identities (access key -> caller; all keys are in " + str(identities_file) + "):",
    ]
    for identity in stack.identities:
        role = " (admin)" if identity.admin else ""
        lines.append(f"  {identity.name:6} {identity.access_key_id}  {identity.arn}{role}")
    client = [
        '    "sagemaker",',
        f'    endpoint_url="{stack.emulator.endpoint_url}",',
        f'    region_name="{stack.region}",',
        f'    aws_access_key_id="{user.access_key_id}",',
        f'    aws_secret_access_key="{user.secret_access_key}",',
    ]
    lines += [
        "",
        "In another shell, as the user (add --identity admin for the admin's keys):",
        "",
        'eval "$(sagequeue local env)"',
        "",
        "SDK v2 session (estimator.fit() queues the job), Python:",
        "",
        "import boto3",
        "from sagequeue import QueueSession",
        "aws = boto3.Session(",
        f'    region_name="{stack.region}",',
        f'    aws_access_key_id="{user.access_key_id}",',
        f'    aws_secret_access_key="{user.secret_access_key}",',
        ")",
        "session = QueueSession(",
        "    boto_session=aws,",
        f'    sagemaker_client=aws.client("sagemaker", endpoint_url="{stack.emulator.endpoint_url}"),',
        f'    logs_client=aws.client("logs", endpoint_url="{stack.moto_endpoint}"),',
        ")",
        "",
        "Plain boto3 (SDK v3 too): create_training_job goes to the queue, Python:",
        "",
        "import boto3, sagequeue",
        "sm = boto3.client(",
        *client,
        ")",
        "sagequeue.install(sm)",
        "",
        f"Credentials: flags (--profile) > environment (AWS_ACCESS_KEY_ID, AWS_PROFILE) > {saved.name}.",
        f"The admin's key is {admin.access_key_id}; its secret is in {identities_file.name}.",
        "",
        "Ctrl-C stops it"
        + (
            f"; the queue is saved to {stack.state_path}."
            if stack.state_path
            else " (and the queue with it: --state PATH keeps it)."
        ),
    ]
    return "\n".join(lines)


@click.command("demo")
@click.option(
    "--speed",
    type=click.FloatRange(min=0.001),
    default=None,
    help="Run on the real clock this many times faster than life (e.g. 30) to watch it; default: the virtual clock, done in seconds.",
)
@click.option(
    "--function-logs/--no-function-logs",
    default=False,
    show_default=True,
    help="Print the functions' logs and metric documents.",
)
def demo(speed: float | None, function_logs: bool) -> None:
    """Show sagequeue doing its job on the local stack: a priority scenario (preemption and
    resume), warm-pool reuse and an idle job stopped, checked at every step."""
    from sagequeue.local.demo import Demo, DemoFailed, settings, timings
    from sagequeue.local.stack import LocalStack, LocalStackError

    began = time.perf_counter()
    clock = "virtual" if speed is None else "real"
    # On a real clock the queue's own latency (about a second of wall time per step) must stay small beside
    # the jobs' durations, so faster clocks get longer jobs.
    scale = 1.0 if speed is None else max(1.0, speed / 10)
    try:
        stack = LocalStack(
            settings=settings(scale),
            clock=clock,
            speed=speed or 1.0,
            emulator=timings(scale),
            function_logs=function_logs,
            raise_function_errors=True,
            # nothing outside this process talks to the demo's AWS services: moto serves it without HTTP
            aws="in-process",
        )
        stack.start()
    except (LocalStackError, ValueError, OSError) as exc:
        _fail(f"the local stack did not start: {exc}")
    _keep_for_good()
    try:
        click.echo(f"sagequeue demo: local stack up in {stack.startup_seconds:.1f} s ({stack.clock!r})")
        Demo(stack, click.echo, scale=scale).run()
    except DemoFailed as exc:
        _fail(f"the scheduler did not do what the scenario expects: {exc}")
    except Exception as exc:  # noqa: BLE001 - any failure of the stack is a failed demo, said plainly
        _fail(f"the demo stopped: {type(exc).__name__}: {exc}")
    finally:
        stack.stop()
    click.echo(f"\nDemo passed in {time.perf_counter() - began:.1f} s.")
