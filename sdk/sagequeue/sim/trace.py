"""A workload: the jobs a simulation submits, and the importer of recorded histories.

A trace is a list of `TraceJob`s, each submitted at an offset in seconds from the trace's start. It is read
from JSON Lines or CSV (docs/simulator.md documents the fields); a DescribeTrainingJob response per line
(what `aws sagemaker describe-training-job` prints) is read as well, so a real history converts with a
ListTrainingJobs loop and no hand editing.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sagequeue_core.defaults import PRIORITY_TAG
from sagequeue_core.domain import PRIORITY_MAX, PRIORITY_MIN, parse_time, tags_to_dict
from sagequeue_core.quotas import QuotaError, check_team_name

_INSTANCE_TYPE = re.compile(r"ml\.[a-z0-9]+\.[a-z0-9]+")
_NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")
#: The trace's own columns (JSON keys), in the order a CSV trace lists them.
COLUMNS = (
    "name",
    "submit",
    "priority",
    "instance_type",
    "instance_count",
    "duration_seconds",
    "keep_alive_seconds",
    "family",
    "checkpoint_minutes",
    "team",
    "checkpoint_drift",
)
_REQUIRED = ("submit", "priority", "instance_type", "instance_count", "duration_seconds")


#: Where a trace given in second offsets starts: a Monday, 00:00 UTC (office hours matter to the generator).
DEFAULT_START = datetime(2026, 3, 2, tzinfo=UTC)


class TraceError(ValueError):
    """A trace that cannot be read; the message names the line (or the flag) and the problem."""


@dataclass(frozen=True)
class TraceJob:
    """One job of a workload.

    `family`: jobs of one family with the same instance type and count share a warm-pool resource key (a
    sweep); None gives the job a key of its own. `checkpoint_minutes`: training time between checkpoints;
    None (or 0) means the job keeps no checkpoints and a preemption loses all its work.
    `checkpoint_drift`: how far each interval between checkpoints may differ from the one before, as a
    share (0.2: up to 20 % longer or shorter, within half and twice `checkpoint_minutes`); None: none.
    """

    name: str
    submit_seconds: float
    priority: int
    instance_type: str
    instance_count: int
    duration_seconds: float
    keep_alive_seconds: int = 0
    family: str | None = None
    checkpoint_minutes: float | None = None
    team: str | None = None  # whose quota the job draws on (SimSettings.team_quotas)
    checkpoint_drift: float | None = None

    @property
    def gang(self) -> bool:
        """A job of four or more instances: it needs a pool nearly to itself."""
        return self.instance_count >= 4

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "submit": self.submit_seconds,
            "priority": self.priority,
            "instance_type": self.instance_type,
            "instance_count": self.instance_count,
            "duration_seconds": self.duration_seconds,
            "keep_alive_seconds": self.keep_alive_seconds,
            "family": self.family,
            "checkpoint_minutes": self.checkpoint_minutes,
            **({"team": self.team} if self.team else {}),
            **({"checkpoint_drift": self.checkpoint_drift} if self.checkpoint_drift else {}),
        }


@dataclass(frozen=True)
class Trace:
    jobs: tuple[TraceJob, ...]
    start: datetime = DEFAULT_START
    description: str = ""
    pools: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.pools:
            object.__setattr__(self, "pools", tuple(sorted({j.instance_type for j in self.jobs})))

    @property
    def last_submit_seconds(self) -> float:
        return max((j.submit_seconds for j in self.jobs), default=0.0)

    def to_jsonl(self) -> str:
        return "".join(json.dumps(job.to_dict()) + "\n" for job in self.jobs)

    def check_pools(self, capacity: Mapping[str, int]) -> None:
        """Every job's instance type must be a pool the simulation is given a capacity for."""
        for index, job in enumerate(self.jobs, start=1):
            if job.instance_type not in capacity:
                known = ", ".join(sorted(capacity)) or "none"
                raise TraceError(
                    f"job {index} ({job.name}): instance type {job.instance_type} has no pool "
                    f"(pools given with --capacity: {known})"
                )


# --- reading -------------------------------------------------------------------------------------------------


def load_trace(path: str | Path) -> Trace:
    """A trace from a `.jsonl`/`.json`/`.ndjson` or `.csv` file (by extension; `-` is not accepted)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise TraceError(f"trace {path} is not UTF-8 text: {exc.reason}") from exc
    if path.suffix.lower() == ".csv":
        return parse_csv(text, source=str(path))
    return parse_jsonl(text, source=str(path))


def parse_jsonl(text: str, *, source: str = "trace") -> Trace:
    rows: list[tuple[int, Mapping[str, Any]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{source} line {number}: not JSON ({exc.msg} at column {exc.colno})") from exc
        if not isinstance(value, dict):
            raise TraceError(f"{source} line {number}: expected a JSON object, got {type(value).__name__}")
        rows.append((number, value))
    return _build(rows, source)


def parse_csv(text: str, *, source: str = "trace") -> Trace:
    reader = csv.DictReader(io.StringIO(text))
    header = [h.strip() for h in reader.fieldnames or []]
    missing = [c for c in _REQUIRED if c not in header]
    if missing:
        raise TraceError(f"{source} line 1: the CSV header lacks column(s) {', '.join(missing)}")
    unknown = [h for h in header if h not in COLUMNS]
    if unknown:
        raise TraceError(f"{source} line 1: unknown column(s) {', '.join(unknown)}")
    rows: list[tuple[int, Mapping[str, Any]]] = []
    for record in reader:
        number = reader.line_num
        if None in record:
            raise TraceError(f"{source} line {number}: more fields than the header has columns")
        clean = {k.strip(): (v.strip() if isinstance(v, str) else v) for k, v in record.items() if k}
        rows.append((number, {k: v for k, v in clean.items() if v not in ("", None)}))
    return _build(rows, source)


def _build(rows: Iterable[tuple[int, Mapping[str, Any]]], source: str) -> Trace:
    parsed: list[tuple[int, datetime | None, float | None, TraceJob]] = []
    names: dict[str, int] = {}
    for number, row in rows:
        where = f"{source} line {number}"
        if "TrainingJobName" in row or "ResourceConfig" in row:
            row = _from_description(row, where)
        job, absolute, offset = _row(row, where, default_name=f"job-{len(parsed) + 1:04d}")
        if job.name in names:
            raise TraceError(f"{where}: job name {job.name!r} already used on line {names[job.name]}")
        names[job.name] = number
        parsed.append((number, absolute, offset, job))
    if not parsed:
        raise TraceError(f"{source}: the trace has no jobs")
    kinds = {absolute is not None for _, absolute, _, _ in parsed}
    if len(kinds) > 1:
        number = next(n for n, a, _, _ in parsed if (a is not None) != (parsed[0][1] is not None))
        raise TraceError(
            f"{source} line {number}: submit times mix timestamps and second offsets; use one kind"
        )
    if parsed[0][1] is not None:
        start = min(a for _, a, _, _ in parsed if a is not None)
        jobs = [
            _with_submit(job, (absolute - start).total_seconds())
            for _, absolute, _, job in parsed
            if absolute is not None
        ]
    else:
        start = DEFAULT_START
        jobs = [_with_submit(job, offset or 0.0) for _, _, offset, job in parsed]
    jobs.sort(key=lambda j: (j.submit_seconds, j.name))
    return Trace(tuple(jobs), start=start, description=source)


def _with_submit(job: TraceJob, seconds: float) -> TraceJob:
    return TraceJob(**{**_fields(job), "submit_seconds": seconds})


def _fields(job: TraceJob) -> dict[str, Any]:
    return {
        "name": job.name,
        "submit_seconds": job.submit_seconds,
        "priority": job.priority,
        "instance_type": job.instance_type,
        "instance_count": job.instance_count,
        "duration_seconds": job.duration_seconds,
        "keep_alive_seconds": job.keep_alive_seconds,
        "family": job.family,
        "checkpoint_minutes": job.checkpoint_minutes,
        "team": job.team,
        "checkpoint_drift": job.checkpoint_drift,
    }


def _row(
    row: Mapping[str, Any], where: str, *, default_name: str
) -> tuple[TraceJob, datetime | None, float | None]:
    unknown = sorted(set(row) - set(COLUMNS))
    if unknown:
        raise TraceError(f"{where}: unknown field(s) {', '.join(unknown)} (fields: {', '.join(COLUMNS)})")
    missing = [c for c in _REQUIRED if row.get(c) in (None, "")]
    if missing:
        raise TraceError(f"{where}: missing {', '.join(missing)}")
    name = str(row.get("name") or default_name)
    if not _NAME.fullmatch(name):
        raise TraceError(f"{where}: name {name!r} is not a SageMaker training job name")
    absolute, offset = _submit(row["submit"], where)
    priority = _integer(row["priority"], "priority", where)
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise TraceError(
            f"{where}: priority must be between {PRIORITY_MIN} and {PRIORITY_MAX}, got {priority}"
        )
    instance_type = str(row["instance_type"])
    if not _INSTANCE_TYPE.fullmatch(instance_type):
        raise TraceError(f"{where}: instance_type must look like ml.trn1.32xlarge, got {instance_type!r}")
    count = _integer(row["instance_count"], "instance_count", where)
    if count < 1:
        raise TraceError(f"{where}: instance_count must be at least 1, got {count}")
    duration = _number(row["duration_seconds"], "duration_seconds", where)
    if duration <= 0:
        raise TraceError(f"{where}: duration_seconds must be positive, got {duration:g}")
    keep_alive = _integer(row.get("keep_alive_seconds", 0), "keep_alive_seconds", where)
    if not 0 <= keep_alive <= 21_600:
        raise TraceError(f"{where}: keep_alive_seconds must be between 0 and 21600, got {keep_alive}")
    checkpoint = row.get("checkpoint_minutes")
    minutes = None if checkpoint in (None, "") else _number(checkpoint, "checkpoint_minutes", where)
    if minutes is not None and minutes < 0:
        raise TraceError(f"{where}: checkpoint_minutes must not be negative, got {minutes:g}")
    drift_value = row.get("checkpoint_drift")
    drift = None if drift_value in (None, "") else _number(drift_value, "checkpoint_drift", where)
    if drift is not None and not 0 <= drift < 1:
        raise TraceError(f"{where}: checkpoint_drift must be at least 0 and below 1, got {drift:g}")
    family = row.get("family")
    team = row.get("team")
    if team not in (None, ""):
        try:
            team = check_team_name(str(team))
        except QuotaError as exc:
            raise TraceError(f"{where}: {exc}") from None
    job = TraceJob(
        name=name,
        submit_seconds=offset or 0.0,
        priority=priority,
        instance_type=instance_type,
        instance_count=count,
        duration_seconds=duration,
        keep_alive_seconds=keep_alive,
        family=str(family) if family not in (None, "") else None,
        checkpoint_minutes=minutes or None,
        team=team or None,
        checkpoint_drift=(drift or None) if minutes else None,
    )
    return job, absolute, offset


def _submit(value: Any, where: str) -> tuple[datetime | None, float | None]:
    """Seconds from the trace's start (a number) or a timestamp (ISO 8601 or epoch milliseconds string)."""
    if isinstance(value, bool):
        raise TraceError(f"{where}: submit must be seconds or a timestamp, got {value!r}")
    if isinstance(value, int | float) or (isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)?", value)):
        seconds = float(value)
        if seconds > 1e9:  # an epoch time, not an offset
            moment = parse_time(value if not isinstance(value, str) else seconds)
            return moment, None
        return None, seconds
    if isinstance(value, str):
        moment = parse_time(value)
        if moment is not None:
            return moment, None
    raise TraceError(f"{where}: submit must be seconds from the start or an ISO 8601 time, got {value!r}")


def _integer(value: Any, name: str, where: str) -> int:
    if isinstance(value, bool):
        raise TraceError(f"{where}: {name} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
        return int(value)
    raise TraceError(f"{where}: {name} must be an integer, got {value!r}")


def _number(value: Any, name: str, where: str) -> float:
    if isinstance(value, bool):
        raise TraceError(f"{where}: {name} must be a number, got {value!r}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise TraceError(f"{where}: {name} must be a number, got {value!r}")


def _from_description(row: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A DescribeTrainingJob response as a trace row: creation time, the priority tag, the cluster, the
    time it trained (TrainingTimeInSeconds) and its keep-alive."""
    config = row.get("ResourceConfig")
    if not isinstance(config, Mapping):
        raise TraceError(f"{where}: a DescribeTrainingJob record needs ResourceConfig")
    tags = row.get("Tags")
    try:
        tag_map = tags_to_dict(tags)
    except ValueError as exc:
        raise TraceError(f"{where}: {exc}") from exc
    duration = row.get("TrainingTimeInSeconds")
    if duration is None:
        raise TraceError(f"{where}: a DescribeTrainingJob record needs TrainingTimeInSeconds (an ended job)")
    out: dict[str, Any] = {
        "name": row.get("TrainingJobName"),
        "submit": row.get("CreationTime"),
        "priority": tag_map.get(PRIORITY_TAG, 0),
        "instance_type": config.get("InstanceType"),
        "instance_count": config.get("InstanceCount"),
        "duration_seconds": duration,
        "keep_alive_seconds": config.get("KeepAlivePeriodInSeconds") or 0,
    }
    if row.get("CheckpointConfig"):
        out["checkpoint_minutes"] = tag_map.get("checkpoint-minutes", 30)
    if tag_map.get("team"):
        out["team"] = tag_map["team"]  # the stack's default TeamTag
    return {k: v for k, v in out.items() if v is not None}


__all__ = ["COLUMNS", "Trace", "TraceError", "TraceJob", "load_trace", "parse_csv", "parse_jsonl"]
