"""`sagequeue configure`: the few answers a first deploy needs, saved in samconfig.toml so that
`sam deploy` runs without `--guided` (which asks every one of the template's parameters).

The rest keep the template's defaults; every parameter is in docs/deploy.md, and one set later is one more
`Key="value"` in `parameter_overrides`, or `sam deploy --parameter-overrides Key=value`.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import click

#: (parameter, question, default, required): what a first deploy needs.
QUESTIONS = (
    ("AllowedRoleArns", "SageMaker execution roles jobs may run as (comma-separated ARNs)", "", True),
    (
        "AdminRoleArns",
        "Admins: roles or users that may change any job and set capacity (comma-separated)",
        "",
        False,
    ),
    ("Capacity", "Pools: instances per type, e.g. ml.trn1.32xlarge=4,ml.trn2.48xlarge=2", "", False),
    ("OperationsEndpoint", "E-mail address or https URL the health alarms notify (empty: none)", "", False),
)
_ARN = re.compile(r"^arn:aws[a-z-]*:(iam|sts)::\d{12}:\S+$")
_POOLS = re.compile(
    r"^(\s*(ml\.[a-z0-9]+\.[a-z0-9]+|plan:[A-Za-z0-9-]{1,64})\s*=\s*\d+\s*)(,\s*(ml\.[a-z0-9]+\.[a-z0-9]+|plan:[A-Za-z0-9-]{1,64})\s*=\s*\d+\s*)*$"
)


def check(parameter: str, value: str) -> str | None:
    """What is wrong with an answer (None: nothing)."""
    if parameter in ("AllowedRoleArns", "AdminRoleArns") and value:
        bad = [arn for arn in (a.strip() for a in value.split(",")) if not _ARN.match(arn)]
        if bad:
            return f"not an IAM ARN: {', '.join(bad)}"
    if parameter == "Capacity" and value and not _POOLS.match(value):
        return "expected TYPE=N pairs, e.g. ml.trn1.32xlarge=4,ml.trn2.48xlarge=2"
    if (
        parameter == "OperationsEndpoint"
        and value
        and not (value.startswith("https://") or re.fullmatch(r"[^@\s]+@[^@\s]+", value))
    ):
        return "expected an e-mail address or an https:// URL"
    return None


def read_overrides(text: str) -> dict[str, str]:
    """The `parameter_overrides` of samconfig.toml's default deploy section, as a mapping."""
    document = tomllib.loads(text) if text.strip() else {}
    raw = document.get("default", {}).get("deploy", {}).get("parameters", {}).get("parameter_overrides", "")
    pairs = shlex.split(raw) if isinstance(raw, str) else [str(item) for item in raw]
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        out[key] = value
    return out


def _toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _set(text: str, section: str, key: str, value: str) -> str:
    """`text` with `key = value` in `[section]` (replaced, or added at the section's end, or a new section)."""
    line = f"{key} = {_toml_string(value)}"
    header = f"[{section}]"
    lines = text.splitlines()
    if header not in lines:
        return text.rstrip("\n") + f"\n\n{header}\n{line}\n"
    start = lines.index(header) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("[")), len(lines))
    for i in range(start, end):
        if re.match(rf"^{re.escape(key)}\s*=", lines[i]):
            lines[i] = line
            return "\n".join(lines) + "\n"
    while end > start and not lines[end - 1].strip():
        end -= 1
    lines.insert(end, line)
    return "\n".join(lines) + "\n"


def write(text: str, stack_name: str, region: str, overrides: dict[str, str]) -> str:
    joined = " ".join(
        f"{key}={shlex.quote(value) if value else chr(34) * 2}" for key, value in overrides.items()
    )
    text = _set(text, "default.global.parameters", "stack_name", stack_name)
    text = _set(text, "default.deploy.parameters", "region", region)
    return _set(text, "default.deploy.parameters", "parameter_overrides", joined)


@click.command("configure")
@click.option(
    "--config-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("samconfig.toml"),
    show_default=True,
    help="The samconfig.toml `sam deploy` reads.",
)
def configure(config_file: Path) -> None:
    """Ask what a first deploy needs (stack name, region, roles, pools, where alarms go) and save it in
    samconfig.toml; then `sam build && sam deploy` deploys with the template's defaults for the rest."""
    text = config_file.read_text(encoding="utf-8") if config_file.exists() else ""
    try:
        document = tomllib.loads(text) if text.strip() else {}
    except tomllib.TOMLDecodeError as exc:
        raise click.ClickException(f"{config_file} is not TOML: {exc}") from exc
    previous = read_overrides(text)
    default = document.get("default", {})
    stack_name = click.prompt(
        "Stack name", default=default.get("global", {}).get("parameters", {}).get("stack_name", "sagequeue")
    )
    region = click.prompt(
        "Region", default=default.get("deploy", {}).get("parameters", {}).get("region", "us-east-1")
    )
    answers = dict(previous)
    for parameter, question, fallback, required in QUESTIONS:
        while True:
            value = str(
                click.prompt(
                    f"{question} [{parameter}]",
                    default=previous.get(parameter, fallback),
                    show_default=bool(previous.get(parameter, fallback)),
                    type=str,
                )
            ).strip()
            problem = check(parameter, value) if value else ("required" if required else None)
            if problem is None:
                break
            click.echo(f"  {problem}", err=True)
        answers[parameter] = value
    config_file.write_text(write(text, stack_name, region, answers), encoding="utf-8")
    click.echo(f"saved in {config_file}; next: sagequeue preflight, then sam build && sam deploy")
