"""The queue commands of `sagequeue`: submit, ls, show, cancel, priority, hold, release, pools, capacity,
whoami.

Each command finds the queue as QueueClient does (--endpoint, --stack-name, SAGEQUEUE_ENDPOINT,
SAGEQUEUE_STACK_NAME, or the stack `sagequeue local` saved) and prints a table, or JSON with --json.
Errors are one line on stderr (a JSON object with --json) and an exit code a script can test:

    0  done
    1  the queue refused: invalid request, no such job, not allowed, conflicting state, throttled
    2  bad usage or input (unknown option, unreadable or invalid request file)
    3  the queue cannot be located or reached (no endpoint, unknown stack, no credentials, connection)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar

import click

from sagequeue.client import Job, Pool, QueueClient
from sagequeue.exceptions import (
    ApiError,
    ConfigurationError,
    CredentialsError,
    EndpointUnreachable,
    SageQueueError,
)
from sagequeue_core.quotas import QuotaError, check_team_name

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

_STATES = (
    "queued",
    "held",
    "starting",
    "running",
    "preempting",
    "stopping",
    "completed",
    "failed",
    "cancelled",
    "idle_stopped",
)
_ACTIVE_STATES = ("queued", "held", "starting", "running", "preempting", "stopping")

F = TypeVar("F", bound=Callable[..., Any])


# --- shared options and error handling -----------------------------------------------------------------------


class Target:
    """Where to send requests, from the common options; the client is made on first use."""

    def __init__(
        self,
        endpoint: str | None,
        stack_name: str | None,
        region: str | None,
        profile: str | None,
        api_id: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.stack_name = stack_name
        self.region = region
        self.profile = profile
        self.api_id = api_id
        self._client: QueueClient | None = None

    def client(self) -> QueueClient:
        if self._client is None:
            self._client = QueueClient(
                self.endpoint,
                stack_name=self.stack_name,
                region=self.region,
                profile=self.profile,
                api_id=self.api_id,
            )
        return self._client


def _queue_command(
    name: str, *, json_output: bool = True, negative_numbers: bool = False
) -> Callable[[F], click.Command]:
    """A click command with the endpoint options (and --json), whose errors become one line and an exit
    code. The function receives `target: Target` and `as_json: bool` in place of those options."""

    def decorate(func: F) -> click.Command:
        @functools.wraps(func)
        def run(
            endpoint: str | None,
            stack_name: str | None,
            region: str | None,
            profile: str | None,
            api_id: str | None,
            as_json: bool = False,
            **kwargs: Any,
        ) -> None:
            if endpoint is not None:
                from sagequeue.client import _check_endpoint

                try:
                    _check_endpoint(endpoint, "--endpoint")
                except ConfigurationError as exc:
                    _usage_error(str(exc), as_json)
            target = Target(endpoint, stack_name, region, profile, api_id)
            try:
                func(target=target, as_json=as_json, **kwargs)
            except SageQueueError as exc:
                _fail(exc, as_json)
            except BrokenPipeError:
                raise  # the reader of the output went away: the command group ends quietly
            except Exception as exc:  # noqa: BLE001 - a CLI prints one line, never a traceback
                _fail_unexpected(exc, as_json)

        command = run
        if json_output:
            command = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(
                command
            )
        command = click.option(
            "--api-id",
            metavar="ID",
            help="API id, for a private API called through a VPC endpoint's own DNS name (SAGEQUEUE_API_ID).",
        )(command)
        command = click.option(
            "--profile", metavar="NAME", help="AWS profile whose credentials sign requests."
        )(command)
        command = click.option(
            "--region", metavar="REGION", help="AWS region of the API (default: from the endpoint)."
        )(command)
        command = click.option(
            "--stack-name",
            metavar="STACK",
            help="Deployed sagequeue stack whose ApiUrl output is the endpoint (default: SAGEQUEUE_STACK_NAME).",
        )(command)
        command = click.option(
            "--endpoint",
            metavar="URL",
            help="API base URL (default: SAGEQUEUE_ENDPOINT, then the saved local stack).",
        )(command)
        # a positional argument may be a negative number (`priority NAME -1`), not an unknown option
        settings = {"ignore_unknown_options": True} if negative_numbers else {}
        return click.command(name, context_settings=settings)(command)

    return decorate


def _fail(exc: SageQueueError, as_json: bool) -> NoReturn:
    if isinstance(exc, (EndpointUnreachable, ConfigurationError, CredentialsError)):
        code = EXIT_UNREACHABLE
    else:
        code = EXIT_REFUSED
    error_code = exc.code if isinstance(exc, ApiError) else type(exc).__name__
    message = exc.message if isinstance(exc, ApiError) else str(exc)
    _emit_error(error_code, message, as_json)
    sys.exit(code)


def _fail_unexpected(exc: Exception, as_json: bool) -> NoReturn:
    from botocore.exceptions import BotoCoreError

    if isinstance(exc, BotoCoreError):
        # e.g. a profile that does not exist, an SSO session that expired
        _emit_error(type(exc).__name__, str(exc), as_json)
        sys.exit(EXIT_UNREACHABLE)
    _emit_error(type(exc).__name__, f"unexpected error: {exc}", as_json)
    sys.exit(EXIT_REFUSED)


def _emit_error(code: str, message: str, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"error": {"code": code, "message": message}}), err=True)
    else:
        click.echo(f"error: {message}", err=True)


def _usage_error(message: str, as_json: bool) -> NoReturn:
    _emit_error("UsageError", message, as_json)
    sys.exit(EXIT_USAGE)


def _print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=False, default=str))


# --- formatting ----------------------------------------------------------------------------------------------


def duration_text(seconds: float | None) -> str:
    """A duration as every sagequeue table shows it: 40s, 2m00s, 1h00m, 1d02h; '-' when unknown."""
    return _duration(seconds)


def table_text(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Columns as every sagequeue table lays them out: upper-case headings, two spaces apart."""
    return _table(headers, rows)


def _duration(seconds: float | None) -> str:
    if seconds is None or seconds < 0:
        return "-"
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def _span(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return (end - start).total_seconds()


def waited(job: Job, now: datetime) -> float | None:
    """Time in the queue: until the current attempt started, or until now while waiting."""
    if job.waiting:
        return _span(job.submitted_at, now)
    return _span(job.submitted_at, job.started_at or job.ended_at)


def ran(job: Job, now: datetime) -> float | None:
    """Time the current (or last) attempt has run: none while it waits or is still starting (SageMaker
    has not begun running it), counted from its start once it runs."""
    if job.started_at is None or job.waiting or job.state == "starting":
        return None
    return _span(job.started_at, job.ended_at or now)


def checkpoint_age(job: Job, now: datetime) -> str:
    """How long ago the live attempt's last checkpoint was complete ("4m ago"); '-' when none is known."""
    at = job.last_checkpoint_at
    if at is None:
        return "-"
    seconds = max((now - at).total_seconds(), 0)
    if seconds < 60:
        return f"{int(seconds)}s ago"
    if seconds < 3600:
        return f"{int(seconds // 60)}m ago"
    return f"{_duration(seconds)} ago"


def _checkpoint_line(job: Job, now: datetime) -> str | None:
    """`show`'s last checkpoint: its age, step and the attempt's interval; None when none is known."""
    checkpoint = job.raw.get("checkpoint")
    if job.last_checkpoint_at is None or not isinstance(checkpoint, Mapping):
        return None
    parts = [checkpoint_age(job, now)]
    if checkpoint.get("step") is not None:
        parts.append(f"step {checkpoint['step']}")
    interval = checkpoint.get("interval_seconds")
    if isinstance(interval, int | float):
        parts.append(f"every {_duration(interval)}")
    return f"{parts[0]} ({', '.join(parts[1:])})" if len(parts) > 1 else parts[0]


#: `SAGEQUEUE_TABLES`: `rich` or `plain` tables whatever the output is; unset: rich on a terminal.
TABLES_VARIABLE = "SAGEQUEUE_TABLES"


def _rich_tables() -> bool:
    import os

    chosen = os.environ.get(TABLES_VARIABLE, "").strip().lower()
    if chosen not in ("", "rich", "plain"):
        raise click.ClickException(f"{TABLES_VARIABLE}={chosen!r}: use rich or plain")
    if chosen == "plain" or (not chosen and not sys.stdout.isatty()):
        return False
    try:
        import rich  # noqa: F401
    except ImportError:  # an install without rich: the plain layout is the same table
        return False
    return True


def _rich_table(headers: Sequence[str], text_rows: list[list[str]]) -> str:
    import shutil
    from io import StringIO

    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    for heading in headers:
        table.add_column(heading, no_wrap=True, overflow="fold")
    for row in text_rows:
        table.add_row(*row)
    buffer = StringIO()
    width = shutil.get_terminal_size((160, 24)).columns
    Console(file=buffer, force_terminal=True, width=width, highlight=False).print(table)
    return buffer.getvalue().rstrip("\n")


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """The same cells either way: a rich table on a terminal (or SAGEQUEUE_TABLES=rich), else plain columns
    two spaces apart, which scripts and pipes read."""
    text_rows = [[("-" if cell is None else str(cell)) for cell in row] for row in rows]
    if _rich_tables():
        return _rich_table(headers, text_rows)
    widths = [len(h) for h in headers]
    for row in text_rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in text_rows]
    return "\n".join(lines)


def _start_cell(start: Any, job: Job, now: datetime) -> str | None:
    """A waiting job's forecast start: its P50, and the P10-P90 range (a JobForecast), or `?`."""
    if not job.waiting:
        return None
    if start is None:
        return "?"
    if isinstance(start, datetime):
        return "now" if start <= now else f"in {_duration((start - now).total_seconds())}"
    return _forecast_text(start, now)


def _forecast_text(forecast: Any, now: datetime) -> str:
    """`in 2h (1h-5h)`: P50 and the P10-P90 range from now; `later than 14d` past the horizon."""
    import math

    offset = (forecast.now - now).total_seconds()

    def span(seconds: float) -> str:
        if math.isinf(seconds):
            return "?"
        return "now" if seconds + offset <= 0 else _duration(seconds + offset)

    if math.isinf(forecast.p50):
        return "later than 14d"
    middle = "now" if forecast.p50 + offset <= 0 else f"in {span(forecast.p50)}"
    return f"{middle} ({span(forecast.p10)}-{span(forecast.p90)})"


#: `ls` columns: name -> (heading, cell from (job, now, estimated starts)).
COLUMNS: dict[str, tuple[str, Callable[[Job, datetime, dict[str, Any]], Any]]] = {
    "name": ("NAME", lambda j, now, starts: j.name),
    "state": ("STATE", lambda j, now, starts: j.state),
    "priority": ("PRIORITY", lambda j, now, starts: j.priority),
    "attempt": ("ATTEMPT", lambda j, now, starts: j.attempt),
    "pool": ("POOL", lambda j, now, starts: j.pool),
    "instances": ("INSTANCES", lambda j, now, starts: j.instances),
    "position": ("POSITION", lambda j, now, starts: j.position),
    "waited": ("WAITED", lambda j, now, starts: _duration(waited(j, now))),
    "ran": ("RAN", lambda j, now, starts: _duration(ran(j, now))),
    "checkpoint": ("CKPT", lambda j, now, starts: checkpoint_age(j, now)),
    "start": ("START", lambda j, now, starts: _start_cell(starts.get(j.name), j, now)),
    "owner": ("OWNER", lambda j, now, starts: j.owner),
    "user": ("USER", lambda j, now, starts: user_name(j.owner)),
    "team": ("TEAM", lambda j, now, starts: j.raw.get("team")),
    "training_job": ("TRAINING_JOB", lambda j, now, starts: j.training_job_name),
    "submitted": ("SUBMITTED", lambda j, now, starts: _when(j.submitted_at)),
    "reason": ("REASON", lambda j, now, starts: j.reason),
}
DEFAULT_COLUMNS = (
    "name",
    "state",
    "priority",
    "attempt",
    "pool",
    "position",
    "waited",
    "ran",
    "checkpoint",
    "reason",
)


def _columns(spec: str | None, with_start: bool) -> list[str]:
    if spec is None:
        names = list(DEFAULT_COLUMNS)
        if with_start:
            names.insert(names.index("waited"), "start")
        return names
    names = [part.strip().lower() for part in spec.split(",") if part.strip()]
    unknown = [n for n in names if n not in COLUMNS]
    if unknown or not names:
        raise click.BadParameter(
            f"unknown column(s) {', '.join(unknown) or '(none given)'}; columns: {', '.join(COLUMNS)}",
            param_hint="'--format'",
        )
    if with_start and "start" not in names:
        names.append("start")
    return names


def _in_order(jobs: Iterable[Job]) -> list[Job]:
    """The queue's order as `ls` shows it: highest priority first, then by time of submission."""
    return sorted(
        jobs, key=lambda j: (-j.priority, j.submitted_at or datetime.max.replace(tzinfo=UTC), j.name)
    )


def jobs_table(
    jobs: Sequence[Job],
    now: datetime,
    columns: Sequence[str] = DEFAULT_COLUMNS,
    starts: dict[str, Any] | None = None,
) -> str:
    chosen = [COLUMNS[name] for name in columns]
    rows = [[cell(j, now, starts or {}) for _, cell in chosen] for j in _in_order(jobs)]
    return _table([heading for heading, _ in chosen], rows)


def _with_positions(client: QueueClient, jobs: list[Job]) -> list[Job]:
    """Listings carry no queue position; a queued job's detail does."""
    return [client.job(j.name) if j.state == "queued" and j.position is None else j for j in jobs]


def _estimate(client: QueueClient, jobs: Sequence[Job], now: datetime) -> dict[str, Any]:
    """Forecast starts (sagequeue.forecast) of the waiting jobs among `jobs`, from the whole queue."""
    from sagequeue.forecast.live import LiveQueue, calibrated, live_forecast

    if not any(j.waiting for j in jobs):
        return {}
    try:
        queue = LiveQueue.read(client)
    except ApiError as exc:
        # the forecast reads the whole queue; a caller the API lets read less gets no forecast, not an error
        click.echo(f"warning: no forecast: {exc.message}", err=True)
        return {}
    waiting = {j.name for j in queue.queued}
    result = live_forecast(queue, only=[j.name for j in jobs if j.name in waiting])
    starts: dict[str, Any] = {}
    for job in jobs:
        if job.state == "queued":
            made = result.get(job.name)
            # the stack's calibration of the job's pool, as on the forecasts it stores (ADR 0026)
            starts[job.name] = calibrated(queue, made, job.pool) if made is not None else None
    for job in jobs:
        if job.state == "held":
            starts[job.name] = None
    return starts


def _forecast_json(forecast: Any) -> dict[str, Any] | None:
    return forecast.to_dict() if forecast is not None and hasattr(forecast, "to_dict") else None


def pools_table(pools: Sequence[Pool]) -> str:
    rows = [
        (
            p.instance_type,
            p.capacity,
            p.used,
            p.free,
            p.queued,
            p.warm,
            "-" if p.warm_quota is None else p.warm_quota,
        )
        for p in pools
    ]
    return _table(("POOL", "CAPACITY", "USED", "FREE", "QUEUED", "WARM", "WARM_QUOTA"), rows)


def _progress_line(job: Job) -> str:
    parts = [f"{job.name}: {job.state}"]
    if job.waiting and job.position:
        parts.append(f"position {job.position} in {job.pool}")
    if job.training_job_name and not job.waiting:
        parts.append(f"attempt {job.attempt} as {job.training_job_name}")
    if job.reason and job.terminal:
        parts.append(job.reason)
    return ", ".join(parts)


def _job_line(verb: str, job: Job) -> str:
    extra = f", position {job.position}" if job.position else ""
    return f"{verb} {job.name}: {job.state}, priority {job.priority}, pool {job.pool}{extra}"


# --- commands ------------------------------------------------------------------------------------------------


def _read_request(source: str, as_json: bool) -> dict[str, Any]:
    try:
        if source == "-":
            text = sys.stdin.read()
            where = "standard input"
        else:
            with open(source, encoding="utf-8") as handle:
                text = handle.read()
            where = source
    except OSError as exc:
        _usage_error(f"cannot read {source}: {exc.strerror or exc}", as_json)
    try:
        request = json.loads(text)
    except json.JSONDecodeError as exc:
        _usage_error(
            f"{where} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
            "expected a CreateTrainingJob request",
            as_json,
        )
    if not isinstance(request, dict):
        _usage_error(
            f"{where} must hold a JSON object (a CreateTrainingJob request), not {type(request).__name__}",
            as_json,
        )
    return request


def _pairs(values: tuple[str, ...], option: str, as_json: bool) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for value in values:
        key, sep, item = value.partition("=")
        if not sep or not key:
            _usage_error(f"{option} {value!r}: expected KEY=VALUE", as_json)
        pairs[key] = item
    return pairs


#: What --generate-skeleton prints for the fields no flag gave.
_PLACEHOLDER_IMAGE = "<account>.dkr.ecr.<region>.amazonaws.com/<repository>:<tag>"
_PLACEHOLDER_ROLE = "arn:aws:iam::<account>:role/<training role the queue allows>"


def build_request(
    *,
    name: str | None,
    image: str | None,
    instance_type: str | None,
    instance_count: int,
    role: str | None,
    output: str | None,
    volume: int,
    max_runtime: int,
    environment: dict[str, str],
    hyperparameters: dict[str, str],
) -> dict[str, Any]:
    """A CreateTrainingJob request from the common flags; fields not given hold placeholders."""
    from datetime import datetime

    request: dict[str, Any] = {
        "TrainingJobName": name or f"sagequeue-{datetime.now(UTC):%Y%m%d-%H%M%S}",
        "RoleArn": role or _PLACEHOLDER_ROLE,
        "AlgorithmSpecification": {"TrainingImage": image or _PLACEHOLDER_IMAGE, "TrainingInputMode": "File"},
        "OutputDataConfig": {"S3OutputPath": output or "s3://<bucket>/<prefix>"},
        "ResourceConfig": {
            "InstanceType": instance_type or "ml.trn1.32xlarge",
            "InstanceCount": instance_count,
            "VolumeSizeInGB": volume,
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": max_runtime},
    }
    if environment:
        request["Environment"] = environment
    if hyperparameters:
        request["HyperParameters"] = hyperparameters
    return request


@_queue_command("submit")
@click.argument("file", metavar="[FILE|-]", required=False)
@click.option("--priority", type=int, help="Priority of the job (default: its 'priority' tag, else 0).")
@click.option("--name", "job_name", metavar="NAME", help="Use this TrainingJobName instead of the file's.")
@click.option("--image", metavar="URI", help="Training image (AlgorithmSpecification.TrainingImage).")
@click.option("--instance-type", metavar="TYPE", help="ResourceConfig.InstanceType, e.g. ml.trn1.32xlarge.")
@click.option(
    "--instance-count", type=click.IntRange(min=1), help="ResourceConfig.InstanceCount (default 1)."
)
@click.option("--role", metavar="ARN", help="RoleArn: the execution role the job passes.")
@click.option("--output", metavar="S3URI", help="OutputDataConfig.S3OutputPath.")
@click.option("--volume", type=click.IntRange(min=1), help="ResourceConfig.VolumeSizeInGB (default 64).")
@click.option(
    "--max-runtime", type=click.IntRange(min=1), help="StoppingCondition.MaxRuntimeInSeconds (default 86400)."
)
@click.option("--env", "environment", multiple=True, metavar="KEY=VALUE", help="Environment (repeatable).")
@click.option(
    "--hyperparameter",
    "hyperparameters",
    multiple=True,
    metavar="KEY=VALUE",
    help="HyperParameters (repeatable).",
)
@click.option(
    "--generate-skeleton",
    is_flag=True,
    help="Print the CreateTrainingJob request (from FILE and the flags, placeholders elsewhere) and exit.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Say where the job would queue and when it would start (a forecast); submit nothing.",
)
@click.option("--wait", is_flag=True, help="Follow the job until it ends; exit 1 unless it completes.")
@click.option(
    "--poll", type=click.FloatRange(min=0.1), default=10.0, show_default=True, help="Seconds between checks."
)
def submit(
    target: Target,
    as_json: bool,
    file: str | None,
    priority: int | None,
    job_name: str | None,
    image: str | None,
    instance_type: str | None,
    instance_count: int | None,
    role: str | None,
    output: str | None,
    volume: int | None,
    max_runtime: int | None,
    environment: tuple[str, ...],
    hyperparameters: tuple[str, ...],
    generate_skeleton: bool,
    dry_run: bool,
    wait: bool,
    poll: float,
) -> None:
    """Queue a CreateTrainingJob request: the JSON in FILE (- reads standard input), or one built from the
    flags (--image, --instance-type, --role, --output are needed then), the flags overriding FILE's fields.

    --generate-skeleton prints the request instead (save it, edit it, submit it). With --wait, print each
    change of the job's state or place until it ends (a JSON document per change with --json).
    """
    env = _pairs(environment, "--env", as_json)
    hyper = _pairs(hyperparameters, "--hyperparameter", as_json)
    if file is not None:
        request = _read_request(file, as_json)
        resource = request.setdefault("ResourceConfig", {})
        algorithm = request.setdefault("AlgorithmSpecification", {})
        for container, key, value in (
            (algorithm, "TrainingImage", image),
            (resource, "InstanceType", instance_type),
            (resource, "InstanceCount", instance_count),
            (resource, "VolumeSizeInGB", volume),
            (request, "RoleArn", role),
            (request.setdefault("OutputDataConfig", {}), "S3OutputPath", output),
            (request.setdefault("StoppingCondition", {}), "MaxRuntimeInSeconds", max_runtime),
        ):
            if value is not None:
                container[key] = value
        if env:
            request["Environment"] = {**(request.get("Environment") or {}), **env}
        if hyper:
            request["HyperParameters"] = {**(request.get("HyperParameters") or {}), **hyper}
    else:
        missing = [
            flag
            for flag, value in (
                ("--image", image),
                ("--instance-type", instance_type),
                ("--role", role),
                ("--output", output),
            )
            if value is None
        ]
        if missing and not generate_skeleton:
            _usage_error(
                f"give a request FILE (or - for standard input), or build one with flags: {', '.join(missing)} "
                "missing (sagequeue submit --generate-skeleton prints a request to start from)",
                as_json,
            )
        request = build_request(
            name=job_name,
            image=image,
            instance_type=instance_type,
            instance_count=instance_count or 1,
            role=role,
            output=output,
            volume=volume or 64,
            max_runtime=max_runtime or 86400,
            environment=env,
            hyperparameters=hyper,
        )
    if job_name:
        request["TrainingJobName"] = job_name
    if generate_skeleton:
        if priority is not None:
            request["priority"] = priority
        _print_json(request)
        return
    if priority is None and "priority" in request:
        # a request saved from the API's body form keeps its priority
        priority = request.pop("priority")
    client = target.client()
    if dry_run:
        _dry_run(client, request, priority, as_json)
        return
    job = client.submit(request, priority=priority)
    if job.waiting and job.position is None:
        job = client.job(job.name)  # the submit answer has no place in the queue; the detail does
    if not wait:
        if as_json:
            _print_json({**job.to_dict(), "position": job.position})
        else:
            click.echo(_job_line("queued", job))
        return

    def report(change: Job) -> None:
        if as_json:
            click.echo(json.dumps(change.to_dict(), default=str))
        else:
            click.echo(_progress_line(change))

    try:
        final = client.wait(job.name, poll=poll, on_change=report)
    except KeyboardInterrupt:
        # the job stays queued: only the wait ends
        click.echo(f"stopped waiting; {job.name} is still in the queue", err=True)
        sys.exit(EXIT_REFUSED)
    if final.state != "completed":
        _emit_error(
            "JobNotCompleted",
            f"job {final.name} ended {final.state}: {final.reason or 'no reason given'}",
            as_json,
        )
        sys.exit(EXIT_REFUSED)


def user_name(owner: str) -> str:
    """The short name of an owner ARN, as `ls` shows it: a role's or a user's name (`role/ml-alice` ->
    `ml-alice`), any other principal as it is."""
    if owner.startswith("arn:") and "/" in owner:
        return owner.rsplit("/", 1)[1]
    return owner


def _dry_run(client: QueueClient, request: dict[str, Any], priority: int | None, as_json: bool) -> None:
    """Where `request` would queue and its forecast start, from the queue as it is; nothing is stored."""
    from sagequeue.forecast import Work, forecast, with_job
    from sagequeue.forecast.live import SETTINGS, LiveQueue, calibrated, history_of, state_of
    from sagequeue_core.domain import (
        DomainError,
        ResourceKey,
        has_checkpoints,
        pool_demand_of,
        primary_pool,
        priority_of,
    )
    from sagequeue_core.policy import QueuedJob, queue_order

    try:
        demand = pool_demand_of(request)
        chosen = priority_of(request, priority)
    except DomainError as exc:
        _usage_error(str(exc), as_json)
    queue = LiveQueue.read(client)
    name = str(request.get("TrainingJobName") or "dry-run")
    pool = primary_pool(demand)
    job = QueuedJob(
        name=f"\x00{name}",
        priority=chosen,
        submitted_at=queue.now,
        demand=demand,
        resource_key=ResourceKey.from_request(request),
        checkpointed=has_checkpoints(request),
    )
    runtime = (request.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds")
    state = with_job(state_of(queue), job, Work(max_runtime_seconds=float(runtime) if runtime else None))
    made = forecast(state, history_of(queue), SETTINGS, only=[job.name]).jobs[job.name]
    predicted = calibrated(queue, made, pool)
    ahead = sum(1 for j in state.queued if pool in j.demand and queue_order(j) < queue_order(job))
    answer = {
        "name": name,
        "pool": pool,
        "instances": sum(demand.values()),
        "priority": chosen,
        "position": ahead + 1,
        "forecast": predicted.to_dict(),
        "stored": False,
    }
    if as_json:
        _print_json(answer)
        return
    when = _forecast_text(predicted, queue.now)
    click.echo(
        f"dry run {name}: would queue at position {ahead + 1} in {pool} (priority {chosen}), "
        f"start {when}; nothing submitted"
    )


def _list(
    client: QueueClient,
    states: Sequence[str],
    *,
    pool: str | None = None,
    owner: str | None = None,
    user: str | None = None,
    team: str | None = None,
) -> list[Job]:
    """Every job the caller may see in `states` (the server decides what that is), narrowed to a pool, an
    owner ARN (both filtered by the server), a user's short name and a team."""
    found: dict[str, Job] = {}
    if owner is not None:
        # one owner's jobs come from one index; the states are picked here
        for job in client.iter_jobs(pool=pool, owner=owner):
            if job.state in states:
                found[job.name] = job
    else:
        for state in states:
            for job in client.iter_jobs(state=state, pool=pool):
                found[job.name] = job
    return [
        job
        for job in found.values()
        if (user is None or user_name(job.owner) == user) and (team is None or job.raw.get("team") == team)
    ]


@_queue_command("ls")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(_STATES),
    help="Only jobs in this state (repeatable); ended states included when asked for.",
)
@click.option("--all", "every_state", is_flag=True, help="Jobs that ended too (completed, failed, ...).")
@click.option("--active", is_flag=True, hidden=True, help="Jobs that have not ended (the default).")
@click.option("--pool", metavar="TYPE", help="Only jobs in this pool (instance type).")
@click.option("--mine", is_flag=True, help="Only my jobs (the caller's, as `whoami` shows).")
@click.option(
    "--user",
    "--owner",
    "user",
    metavar="USER",
    help="Only this user's jobs: an IAM role or user ARN, or its name (the USER column).",
)
@click.option("--team", metavar="TEAM", help="Only this team's jobs.")
@click.option(
    "--limit", type=click.IntRange(min=1), help="At most this many jobs (the first in the order shown)."
)
@click.option("--watch", "watch", is_flag=True, help="Refresh until interrupted.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=5.0,
    show_default=True,
    help="Seconds between refreshes.",
)
@click.option("--count", type=click.IntRange(min=1), help="With --watch, stop after this many refreshes.")
@click.option(
    "--format",
    "columns",
    metavar="COLUMNS",
    help="Comma-separated columns to show, e.g. name,state,position,reason; columns: " + ", ".join(COLUMNS),
)
@click.option(
    "--start",
    "with_start",
    is_flag=True,
    help="Forecast when waiting jobs start: P50 and the P10-P90 range (START; estimated_start, forecast in --json).",
)
def ls(
    target: Target,
    as_json: bool,
    states: tuple[str, ...],
    every_state: bool,
    active: bool,
    pool: str | None,
    mine: bool,
    user: str | None,
    team: str | None,
    limit: int | None,
    watch: bool,
    interval: float,
    count: int | None,
    columns: str | None,
    with_start: bool,
) -> None:
    """Show the queue: every job you may see that has not ended, of every user and team, like squeue.

    Highest priority first, then by time of submission; a USER column appears when the jobs shown belong
    to more than one user, a TEAM column when jobs have teams. --all adds the jobs that ended; --state
    picks states; --mine, --user, --team and --pool narrow the list. --format picks the columns; --start
    adds a forecast of when each waiting job starts (the scheduler's policy run forward, see
    sagequeue.forecast). With --watch and --json, prints one JSON document per refresh.
    """
    if mine and user:
        _usage_error("--mine and --user cannot be used together", as_json)
    if every_state and states:
        _usage_error("--all and --state cannot be used together: --all is every state", as_json)
    if team is not None:
        try:
            check_team_name(team)
        except QuotaError as exc:
            _usage_error(f"--team: {exc}", as_json)
    try:
        chosen = _columns(columns, with_start)
    except click.BadParameter as exc:
        _usage_error(exc.format_message(), as_json)
    client = target.client()
    owner = None
    if mine:
        owner = client.whoami().arn
    elif user is not None and user.startswith("arn:"):
        owner, user = user, None
    if states:
        wanted = [s for s in states if s in _ACTIVE_STATES] if active else list(states)
    else:
        wanted = list(_STATES if every_state else _ACTIVE_STATES)
    refreshes = 0
    try:
        while True:
            listed = _list(client, wanted, pool=pool, owner=owner, user=user, team=team)
            jobs = _with_positions(client, _in_order(listed)[:limit])
            if columns is None:
                if "team" not in chosen and any(j.raw.get("team") for j in jobs):
                    chosen.insert(chosen.index("pool") + 1, "team")  # teams in use: show whose job it is
                if "user" not in chosen and len({j.owner for j in jobs}) > 1:
                    chosen.insert(chosen.index("name") + 1, "user")  # several users' jobs: say whose
            now = client.server_time or datetime.now(UTC)
            starts = _estimate(client, jobs, now) if with_start else {}
            if as_json:
                entries = []
                for j in jobs:
                    entry = {**j.to_dict(), "position": j.position}
                    if with_start and j.waiting:
                        predicted = _forecast_json(starts.get(j.name))
                        entry["estimated_start"] = predicted["p50"] if predicted else None
                        entry["forecast"] = predicted
                    entries.append(entry)
                document = {"jobs": entries}
                click.echo(
                    json.dumps(document, default=str)
                    if watch
                    else json.dumps(document, indent=2, default=str)
                )
            else:
                if watch:
                    click.clear()
                    click.echo(
                        f"sagequeue at {client.endpoint}  {now:%Y-%m-%d %H:%M:%S} UTC  (every {interval:g}s)\n"
                    )
                click.echo(jobs_table(jobs, now, chosen, starts) if jobs else "no jobs")
            refreshes += 1
            if not watch or (count is not None and refreshes >= count):
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        return


#: Attempts `show` lists by name: the latest ones (a job preempted thousands of times has thousands).
SHOWN_ATTEMPTS = 20


@_queue_command("show")
@click.argument("name")
def show(target: Target, as_json: bool, name: str) -> None:
    """A job in detail: state, position, attempts, history and reason."""
    client = target.client()
    job = client.job(name)
    predicted = _estimate(client, [job], client.server_time or datetime.now(UTC)).get(job.name)
    if as_json:
        document = job.to_dict()
        if job.waiting:
            document["forecast"] = _forecast_json(predicted)
        _print_json(document)
        return
    now = client.server_time or datetime.now(UTC)
    fields: list[tuple[str, Any]] = [
        ("name", job.name),
        ("state", job.state),
        ("priority", job.priority),
        ("pool", f"{job.pool} x {job.instances}"),
        ("position", job.position),
        ("owner", job.owner),
        ("attempt", job.attempt),
        ("training job", job.training_job_name),
        ("submitted", _when(job.submitted_at)),
        ("started", _when(job.started_at)),
        ("ended", _when(job.ended_at)),
        ("waited", _duration(waited(job, now))),
        ("ran", _duration(ran(job, now))),
        ("checkpoint", _checkpoint_line(job, now)),
        ("preemptions", job.preemptions),
        ("retries", job.retries),
        ("attempts ended", job.attempts_ended),
        ("trained", f"{_duration(job.seconds_trained)} ({job.seconds_trained} s, ended attempts)"),
        ("reason", job.reason),
    ]
    if job.waiting:
        fields.insert(5, ("forecast start", _start_cell(predicted, job, now)))
    width = max(len(k) for k, _ in fields)
    for key, value in fields:
        click.echo(f"{key.ljust(width)}  {'-' if value is None or value == '' else value}")
    if job.attempts:
        click.echo("\nattempts")
        shown = list(enumerate(job.attempts, start=1))
        if len(shown) > SHOWN_ATTEMPTS:
            click.echo(f"  ... {len(shown) - SHOWN_ATTEMPTS} earlier")
            shown = shown[-SHOWN_ATTEMPTS:]
        for number, attempt in shown:
            click.echo(f"  {number}  {attempt}")
    if job.history:
        click.echo("\nhistory")
        rows = [(_when(h.at), h.state, h.attempt, h.reason) for h in job.history]
        click.echo("  " + _table(("AT", "STATE", "ATTEMPT", "REASON"), rows).replace("\n", "\n  "))


def _when(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%d %H:%M:%S")


def _each(
    target: Target, as_json: bool, names: Sequence[str], action: Callable[[QueueClient, str], Job], verb: str
) -> None:
    """Apply `action` to each name; report every outcome, fail (exit 1) if any failed."""
    client = target.client()
    done: list[Job] = []
    failed: list[tuple[str, ApiError]] = []
    for name in names:
        try:
            done.append(action(client, name))
        except ApiError as exc:
            failed.append((name, exc))
            if not as_json:
                click.echo(f"error: {name}: {exc.message}", err=True)
    if as_json:
        # one name: the job, or nothing on stdout when it failed (the error is on stderr); several: a list
        if len(names) > 1:
            _print_json([j.to_dict() for j in done])
        elif done:
            _print_json(done[0].to_dict())
        for name, error in failed:
            click.echo(
                json.dumps({"error": {"code": error.code, "message": error.message, "job": name}}), err=True
            )
    else:
        for job in done:
            click.echo(_job_line(verb, job))
    if failed:
        sys.exit(EXIT_REFUSED)


@_queue_command("cancel")
@click.argument("names", nargs=-1, required=True, metavar="NAME...")
def cancel(target: Target, as_json: bool, names: tuple[str, ...]) -> None:
    """Cancel jobs: queued ones leave the queue, running ones are stopped."""
    _each(target, as_json, names, lambda c, n: c.cancel(n), "cancelled")


@_queue_command("priority", negative_numbers=True)
@click.argument("name")
@click.argument("priority", type=int)
def priority(target: Target, as_json: bool, name: str, priority: int) -> None:
    """Set the priority of a job (higher runs first)."""
    job = target.client().set_priority(name, priority)
    if as_json:
        _print_json(job.to_dict())
    else:
        click.echo(_job_line("reprioritized", job))


@_queue_command("hold")
@click.argument("names", nargs=-1, required=True, metavar="NAME...")
def hold(target: Target, as_json: bool, names: tuple[str, ...]) -> None:
    """Keep queued jobs from starting until released."""
    _each(target, as_json, names, lambda c, n: c.hold(n), "held")


@_queue_command("release")
@click.argument("names", nargs=-1, required=True, metavar="NAME...")
def release(target: Target, as_json: bool, names: tuple[str, ...]) -> None:
    """Let held jobs start again."""
    _each(target, as_json, names, lambda c, n: c.release(n), "released")


@_queue_command("pools")
def pools(target: Target, as_json: bool) -> None:
    """Pools (instance types): capacity, used, free, queued and warm instances, and the warm-pool quota
    SageMaker showed by not retaining a pool (- when not seen)."""
    found = target.client().pools()
    if as_json:
        _print_json({"pools": [p.to_dict() for p in found]})
    else:
        click.echo(pools_table(found) if found else "no pools: set one with `sagequeue capacity TYPE N`")


@_queue_command("capacity", negative_numbers=True)
@click.argument("instance_type", metavar="TYPE")
@click.argument("instances", metavar="N", type=click.IntRange(min=0))
def capacity(target: Target, as_json: bool, instance_type: str, instances: int) -> None:
    """Set how many TYPE instances the queue may use (admins only)."""
    pool = target.client().set_capacity(instance_type, instances)
    if as_json:
        _print_json(pool.to_dict())
    else:
        click.echo(f"{pool.instance_type}: capacity {pool.capacity}, used {pool.used}, queued {pool.queued}")


def teams_table(shares: Sequence[Mapping[str, Any]]) -> str:
    def limit(value: Any) -> Any:
        return "-" if value is None else value

    rows = [
        (
            s["team"],
            s["pool"],
            s["nominal"],
            limit(s.get("borrowing_limit")),
            limit(s.get("lending_limit")),
            s["used"],
            s["borrowed"],
            s["lent"],
            s.get("waiting", 0),
        )
        for s in shares
    ]
    return _table(
        ("TEAM", "POOL", "NOMINAL", "BORROW_LIMIT", "LEND_LIMIT", "USED", "BORROWED", "LENT", "WAITING"), rows
    )


def _quota_warnings(shares: Sequence[Mapping[str, Any]]) -> None:
    """The API's warnings on quotas (nominal quotas above a pool's capacity), once each, on stderr."""
    for warning in dict.fromkeys(s["warning"] for s in shares if s.get("warning")):
        click.echo(f"warning: {warning}", err=True)


@_queue_command("teams")
def teams(target: Target, as_json: bool) -> None:
    """Teams per pool: nominal quota, limits (- is unlimited), used, borrowed, lent and waiting jobs."""
    found = target.client().teams()
    if as_json:
        _print_json({"teams": found})
    else:
        click.echo(
            teams_table(found) if found else "no team quotas: set one with `sagequeue quota TEAM POOL N`"
        )
        _quota_warnings(found)


@_queue_command("quota")
@click.argument("team")
@click.argument("pool", metavar="POOL")
@click.argument("nominal", metavar="N", type=click.IntRange(min=0), required=False)
@click.option(
    "--borrow-limit", type=click.IntRange(min=0), help="Instances above N it may borrow (default: any)."
)
@click.option(
    "--lend-limit", type=click.IntRange(min=0), help="Of its unused N, what others may borrow (default: all)."
)
@click.option("--remove", is_flag=True, help="Remove TEAM's quota in POOL (in place of N).")
def quota(
    target: Target,
    as_json: bool,
    team: str,
    pool: str,
    nominal: int | None,
    borrow_limit: int | None,
    lend_limit: int | None,
    remove: bool,
) -> None:
    """Set TEAM's quota in POOL to N instances, or remove it with --remove (admins only). Quotas above what
    the pool holds beside the other teams' are stored, with a warning. A quota stored under a name the
    team-name rule now refuses ("-ops") can be removed; none is set under one."""
    if remove:
        if nominal is not None or borrow_limit is not None or lend_limit is not None:
            _usage_error("--remove takes no N, --borrow-limit or --lend-limit", as_json)
        _remove_quota(target, as_json, team, pool)
        return
    if nominal is None:
        _usage_error("N is required: instances guaranteed to TEAM (or --remove to remove its quota)", as_json)
    try:
        check_team_name(team)
    except QuotaError as exc:
        _usage_error(f"TEAM: {exc}", as_json)
    share = target.client().set_team_quota(
        team, pool, nominal, borrowing_limit=borrow_limit, lending_limit=lend_limit
    )
    if as_json:
        _print_json(share)
    else:
        click.echo(teams_table([share]))
        _quota_warnings([share])


def _remove_quota(target: Target, as_json: bool, team: str, pool: str) -> None:
    try:
        # the client refuses, before any request, a name no quota is stored under and '.' or '..'
        answer = target.client().remove_team_quota(team, pool)
    except QuotaError as exc:
        _usage_error(f"TEAM: {exc}", as_json)
    if as_json:
        _print_json(answer)
    else:
        if answer.get("removed"):
            click.echo(f"removed the quota of team {team} in {pool}")
        else:
            click.echo(f"team {team} had no quota in {pool}: nothing to remove")
        _quota_warnings([answer])


@_queue_command("whoami")
def whoami(target: Target, as_json: bool) -> None:
    """Who the API sees you as, and where it is."""
    client = target.client()
    identity = client.whoami()
    if as_json:
        _print_json(
            {
                "arn": identity.arn,
                "admin": identity.admin,
                "endpoint": client.endpoint,
                "region": client.region,
                "endpoint_from": client.endpoint_origin,
            }
        )
        return
    click.echo(f"arn       {identity.arn}")
    click.echo(f"admin     {'yes' if identity.admin else 'no'}")
    click.echo(f"endpoint  {client.endpoint} ({client.endpoint_origin})")
    click.echo(f"region    {client.region}")


@_queue_command("notify")
@click.argument("to", metavar="ENDPOINT")
@click.option(
    "--events",
    "events",
    metavar="KINDS",
    help="Only these notices, comma-separated: started, preempted, requeued, finished, failed, cancelled, "
    "idle_stopped (default: all).",
)
@click.option(
    "--topic", metavar="ARN", help="The job notices topic (default: the stack's JobNoticesTopicArn)."
)
def notify(target: Target, as_json: bool, to: str, events: str | None, topic: str | None) -> None:
    """Send notices of your jobs (start, preemption, requeue, end) to ENDPOINT: an e-mail address, an
    https URL, or an SQS queue or Lambda function ARN.

    Subscribes ENDPOINT to the stack's job notices topic with a filter policy on your identity (as
    `whoami` shows it), so it receives your jobs' notices and no one else's. An e-mail or https endpoint
    receives a confirmation first.
    """
    from sagequeue.notices import subscribe

    kinds = tuple(k.strip() for k in (events or "").split(",") if k.strip())
    done = subscribe(target.client(), to, events=kinds, topic=topic, stack_name=target.stack_name)
    if as_json:
        _print_json(
            {
                "subscription_arn": done.subscription_arn,
                "topic_arn": done.topic_arn,
                "protocol": done.protocol,
                "endpoint": done.endpoint,
                "owner": done.owner,
                "events": list(done.events) or None,
                "pending_confirmation": done.pending,
            }
        )
        return
    which = ", ".join(done.events) if done.events else "every notice"
    click.echo(f"{done.endpoint} gets {which} of the jobs of {done.owner} ({done.topic_arn})")
    if done.pending:
        click.echo(f"confirm the subscription: SNS sent a confirmation to {done.endpoint}")


@_queue_command("why")
@click.argument("name")
def why(target: Target, as_json: bool, name: str) -> None:
    """Why a queued job waits, the jobs ahead of it and the rule that puts each there, and what would start
    it sooner: each change's forecast P50 (one priority higher, fewer instances, another pool, its team's
    quota raised)."""
    from sagequeue.forecast.live import SETTINGS, LiveQueue, calibrated, history_of, state_of
    from sagequeue.forecast.why import explain

    client = target.client()
    job = client.job(name)
    if job.state != "queued":
        _emit_error("NotQueued", f"job {name} is {job.state}, not queued: nothing holds it back", as_json)
        sys.exit(EXIT_REFUSED)
    queue = LiveQueue.read(client)
    try:
        told = explain(state_of(queue), history_of(queue), name, SETTINGS)
    except KeyError:
        _emit_error("NotQueued", f"job {name} left the queue meanwhile", as_json)
        sys.exit(EXIT_REFUSED)
    from sagequeue.forecast.engine import JobForecast

    def text(seconds: float) -> str:
        return _forecast_text(JobForecast(name, queue.now, (seconds,)), queue.now).split(" (")[0]

    # the range with the stack's calibration of the job's pool (ADR 0026); the changes' P50s are the
    # engine's, as the calibration leaves P50s
    shown = calibrated(queue, JobForecast(name, queue.now, (told.p10, told.p50, told.p90)), job.pool)

    if as_json:
        _print_json(
            {
                "name": name,
                "reason": job.reason,
                "forecast": shown.to_dict(),
                "options": [
                    {"change": o.change, "p50": JobForecast(name, queue.now, (o.p50,)).to_dict()["p50"]}
                    for o in told.options
                ],
                "ahead": [dataclasses.asdict(a) for a in told.ahead],
                "running": [{"name": n, "priority": p, "instances": i} for n, p, i in told.running],
            }
        )
        return
    click.echo(f"{name}: {job.reason or 'waiting for a pass'}")
    click.echo(f"forecast start: {_forecast_text(shown, queue.now)}")
    if told.options:
        click.echo("\nwhat would start it sooner (forecast P50)")
        rows = [(o.change, text(o.p50)) for o in told.options]
        click.echo("  " + _table(("CHANGE", "START"), rows).replace("\n", "\n  "))
    click.echo(f"\nahead of it in {job.pool}: {len(told.ahead)}")
    if told.ahead:
        rows2 = [(a.name, a.priority, a.instances, a.rule) for a in told.ahead[:SHOWN_AHEAD]]
        click.echo("  " + _table(("NAME", "PRIORITY", "INSTANCES", "WHY AHEAD"), rows2).replace("\n", "\n  "))
        if len(told.ahead) > SHOWN_AHEAD:
            click.echo(f"  ... {len(told.ahead) - SHOWN_AHEAD} more")
    if told.running:
        click.echo("\nrunning on the pool")
        rows3 = [(n, p, i) for n, p, i in told.running]
        click.echo("  " + _table(("NAME", "PRIORITY", "INSTANCES"), rows3).replace("\n", "\n  "))


#: jobs ahead `why` lists by name
SHOWN_AHEAD = 20


@_queue_command("forecast")
@click.option(
    "--score",
    "scored",
    is_flag=True,
    help="How the stack's past start forecasts did: P10-P90 coverage and the P50's median error, per pool.",
)
@click.option(
    "--hours",
    type=click.IntRange(min=1),
    help="Forecasts made in the last this many hours (default 24; the stack keeps 7 days).",
)
def forecast_command(target: Target, as_json: bool, scored: bool, hours: int | None) -> None:
    """The stack's own forecasts, scored against the starts that followed (`--score`). The forecast of each
    waiting job is in `ls --start`, `show`, `why` and GET /jobs/{name}."""
    if not scored:
        _usage_error(
            "say what to show: --score (ls --start, show and why forecast the waiting jobs)", as_json
        )
    client = target.client()
    answer = client.forecast_score(hours)
    try:
        answer["calibration"] = client.forecast_calibration()
    except ApiError:  # a stack that predates calibrated ranges
        answer["calibration"] = None
    if as_json:
        _print_json(answer)
        return
    click.echo(score_text(answer))


def score_text(answer: Mapping[str, Any]) -> str:
    """The score as a table, with a plain sentence for a pool with too few forecasts scored to say much, and
    the calibration of each pool's ranges in use (ADR 0026): the range's stretch around the P50 (x1.00:
    the engine's) and the coverage the engine's own ranges had."""
    from sagequeue.forecast.calibrate import Calibration

    minimum = answer.get("minimum")
    lines = [f"forecasts made in the last {answer.get('hours')} h, scored against the starts that followed"]
    learnt = answer.get("calibration")
    calibration = Calibration.from_api(learnt)
    rows = []
    thin = []
    for pool in answer.get("pools") or ():
        coverage = pool.get("coverage")
        engine = pool.get("engine_coverage")
        error = pool.get("median_error_seconds")
        adjustment = calibration.for_pool(str(pool.get("pool")))
        if not pool.get("enough"):
            thin.append(
                f"{pool.get('pool')}: too little data to score ({pool.get('scored')} forecast(s) of started "
                f"jobs, {minimum} needed; {pool.get('forecasts')} made)"
            )
        rows.append(
            (
                pool.get("pool"),
                pool.get("forecasts"),
                pool.get("scored"),
                pool.get("covered"),
                "-" if coverage is None else f"{100 * coverage:.0f} %",
                "-" if engine is None else f"{100 * engine:.0f} %",
                "-" if error is None else _duration(error),
                pool.get("overdue"),
                f"x{adjustment.scale:.2f}",
            )
        )
    if rows:
        headings = ("POOL", "FORECASTS", "SCORED", "IN P10-P90", "COVERAGE", "ENGINE COVERAGE", "P50 ERROR")
        lines.append(_table((*headings, "OVERDUE", "RANGE CALIBRATION"), rows))
    else:
        lines.append("no pools")
    lines.extend(thin)
    made_at = learnt.get("made_at") if isinstance(learnt, Mapping) else None
    if made_at:
        lines.append(
            f"ranges calibrated by what past forecasts of the pool got wrong (learnt {made_at}): each P10 and "
            "P90 moved away from the P50 by the factor shown (x1.00: the engine's range)"
        )
    else:
        lines.append("no calibration learnt yet: the ranges are the engine's")
    return "\n".join(lines)


#: What `sagequeue` (sagequeue.cli) adds to its command group.
COMMANDS: dict[str, click.Command] = {
    command.name: command
    for command in (
        submit,
        ls,
        show,
        why,
        forecast_command,
        cancel,
        priority,
        hold,
        release,
        pools,
        capacity,
        teams,
        quota,
        whoami,
        notify,
    )
    if command.name
}
