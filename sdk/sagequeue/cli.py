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
}
# the queue commands (submit, ls, show, cancel, ...) live in sagequeue.queue_cli
_QUEUE_COMMANDS_MODULE = "sagequeue.queue_cli"


class _LazyGroup(click.Group):
    def main(self, *args: Any, **kwargs: Any) -> Any:
        """Run, with every error as one line on stderr: bad usage exits 2, a refusal 1 (see queue_cli)."""
        kwargs["standalone_mode"] = False
        try:
            result = super().main(*args, **kwargs)
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
        command = getattr(importlib.import_module(module_name), attribute)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sagequeue")
def main() -> None:
    """Queue SageMaker training jobs by priority on the capacity you hold."""
