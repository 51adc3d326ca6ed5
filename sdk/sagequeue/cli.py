"""The `sagequeue` command.

Each command group lives beside the code it drives and is imported only when it is invoked, so
`sagequeue --help` starts fast and `sagequeue cache` never imports moto, nor `sagequeue ls` the Hub client.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

# command name -> "module:attribute" of a click command or group
_COMMANDS: dict[str, str] = {
    "local": "sagequeue.local.cli:local",
    "demo": "sagequeue.local.cli:demo",
    "cache": "sagequeue.job.cache_cli:cache",
    "simulate": "sagequeue.sim.cli:simulate_command",
    "preflight": "sagequeue.preflight:preflight",
    "configure": "sagequeue.deploy_config:configure",
}
# the queue commands (submit, ls, show, cancel, ...) live in sagequeue.queue_cli
_QUEUE_COMMANDS_MODULE = "sagequeue.queue_cli"

#: a third-party module a command may import -> the extra that installs it
EXTRA_OF_MODULE: dict[str, str] = {
    "tqdm": "job",
    "huggingface_hub": "job",
    "moto": "local",
    "werkzeug": "local",
    "yaml": "local",
    "samtranslator": "local",
    "pynamodb": "local",
    "aws_lambda_powertools": "local",
    "sagemaker": "sagemaker",
}


class MissingExtra(click.ClickException):
    """A command needs a module of an extra that is not installed: one line naming the extra."""

    exit_code = 2

    def __init__(self, command: str, module: str, extra: str) -> None:
        super().__init__(
            f"`sagequeue {command}` needs {module}, from the [{extra}] extra: "
            f"pip install 'sagequeue[{extra}]'"
        )
        self.extra = extra

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The extra that installs the module an import did not find (None: not a module of an extra)."""
    top = (exc.name or "").partition(".")[0]
    return EXTRA_OF_MODULE.get(top)


class _Unavailable(click.Command):
    """Stands for a command whose module needs an extra that is not installed: listed in `--help`,
    and every use of it (its own `--help` included) answers with one line naming the extra."""

    def __init__(self, name: str, failure: MissingExtra) -> None:
        super().__init__(
            name,
            help=f"(needs the [{failure.extra}] extra: pip install 'sagequeue[{failure.extra}]')",
            add_help_option=False,
            context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        )
        self.failure = failure

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        raise self.failure


class _LazyGroup(click.Group):
    def main(self, *args: Any, **kwargs: Any) -> Any:
        """Run, with every error as one line on stderr: bad usage exits 2, a refusal 1 (see queue_cli)."""
        kwargs["standalone_mode"] = False
        try:
            result = super().main(*args, **kwargs)
        except ModuleNotFoundError as exc:
            extra = missing_extra(exc)
            if extra is None:
                raise
            command = _invoked_command(args, kwargs)
            MissingExtra(command, exc.name or "a module", extra).show()
            sys.exit(MissingExtra.exit_code)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "sagequeue"
            click.echo(f"error: {exc.format_message()} (see {where} --help)", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("error: aborted", err=True)
            sys.exit(1)
        sys.exit(result if isinstance(result, int) else 0)

    def _queue_commands(self) -> dict[str, click.Command]:
        try:
            module = importlib.import_module(_QUEUE_COMMANDS_MODULE)
        except ModuleNotFoundError as exc:
            if exc.name != _QUEUE_COMMANDS_MODULE:
                raise
            return {}
        return dict(getattr(module, "COMMANDS", {}))

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(_COMMANDS) | set(self._queue_commands()) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return self._queue_commands().get(cmd_name) or self.commands.get(cmd_name)
        module_name, _, attribute = target.partition(":")
        try:
            command = getattr(importlib.import_module(module_name), attribute)
        except ModuleNotFoundError as exc:
            extra = missing_extra(exc)
            if extra is None:
                raise
            return _Unavailable(cmd_name, MissingExtra(cmd_name, exc.name or "a module", extra))
        assert isinstance(command, click.Command)
        return command


def _invoked_command(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The words of the command line up to the first option, for the missing-extra line."""
    argv = kwargs.get("args") or (args[0] if args else None)
    words = list(argv) if argv is not None else sys.argv[1:]
    named: list[str] = []
    for word in words[:2]:
        if word.startswith("-"):
            break
        named.append(word)
    return " ".join(named) or "(this command)"


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sagequeue")
def main() -> None:
    """Queue SageMaker training jobs by priority on the capacity you hold."""
