"""The repository that owns sagequeue's one DynamoDB table.

Nothing outside this module sees a pynamodb model, a key string or an index name: callers get domain
objects (Job, Pool, ExternalAttempt, TrackedWarmPool) and named errors. Every read is a GetItem or a Query
on a sparse index; every state change is a conditional write on the item's version.

Items (pk / sk):
    JOB#<name> / JOB                  a queue entry and its current attempt
    POOLS / <instance type>           a pool: capacity, a counter of queued jobs, its recent starts
    POOLS / TEAM#<team>#<pool>        a team's quota in a pool: nominal, borrowing and lending limits
    POOLS / TEAM~usage                decayed instance-hours per team (fair share), as of a time
    EXTERNAL#<training job> / LIVE    a live training job started outside the queue on a managed pool
    WARM#<training job> / WARM        an Available warm pool sagequeue tracks
    CLAIM#<kind>#<subject> / CLAIM    idempotency ledger: the first claim wins
    FORECAST#<job> / FORECAST         the latest start forecast of a waiting job (the forecast function's)
    FORECASTS#<pool> / <made>#<job>   a logged forecast, and the start that followed it once known
    FORECASTS / CALIBRATION           the calibration the forecast function last applied (ADR 0026)

Indexes (all sparse, attributes present only on the items they serve):
    queued            queued_pool, queue_order      queued jobs of a pool: priority desc, then submission
                                                    (read whole, team only, to count each team's waiting)
    queued_team       queued_team_pool, queue_order the same, of one team in a pool (fair share's windows)
    live              live_kind, live_name          LIVE attempts (ours and external), WARM pools
    by_owner          owner, submitted_order
    by_state          state, submitted_order
    by_pool           pool, submitted_order
    by_training_job   training_job_name             the entry of a training job (its current attempt)
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from pynamodb.attributes import (
    NumberAttribute,
    UnicodeAttribute,
    UnicodeSetAttribute,
    UTCDateTimeAttribute,
    VersionAttribute,
)
from pynamodb.exceptions import (
    DeleteError,
    PutError,
    TransactWriteError,
)
from pynamodb.indexes import AllProjection, GlobalSecondaryIndex
from pynamodb.models import Model
from pynamodb.transactions import TransactWrite

from sagequeue_core import observability
from sagequeue_core.checkpoints import CheckpointRecord
from sagequeue_core.defaults import QUOTA_MEMORY_SECONDS
from sagequeue_core.domain import (
    PRIORITY_MAX,
    CapacityWait,
    Job,
    JobState,
    Pool,
    Reservation,
    ResourceKey,
    StopReason,
    active_quota,
)
from sagequeue_core.errors import JobAlreadyExists, JobNotFound, LedgerMoved, PoolNotFound, StaleVersion

if TYPE_CHECKING:
    # Stored forecasts are the forecast function's and the API's (loaded when they read or write them).
    from sagequeue_core.forecasts import PastForecast, StartForecast

    # Team quotas are the API's and the scheduler's; governance and idle_stop, which use this module too,
    # never load them (pools_and_teams imports them when it runs).
    from sagequeue_core.quotas import TeamQuota, UsageCounter

T = TypeVar("T")

_JOB_SK = "JOB"
_POOLS_PK = "POOLS"
#: Team quotas and the usage counter live in the pools' partition, so one Query reads pools and teams (a
#: pass reads no more than it did without teams). No pool name (ml.* or plan:*) starts with the prefix.
_TEAMS_PK = _POOLS_PK
_TEAM_PREFIX = "TEAM#"  # sort key TEAM#<team>#<pool>: a quota
_TEAM_SEP = "#"
_USAGE_SK = "TEAM~usage"  # the decaying usage counter
_LIVE = "LIVE"
_WARM = "WARM"
_CLAIM_SK = "CLAIM"
_FORECAST_SK = "FORECAST"
#: the calibration the forecast function last applied (no job's key: job names have no "#" of their own)
_FORECAST_CALIBRATION_PK = "FORECASTS"
_FORECAST_CALIBRATION_SK = "CALIBRATION"

_CONDITION_FAILED = "ConditionalCheckFailedException"

#: Items DynamoDB accepts in one TransactWriteItems request.
TRANSACTION_ITEMS = 100
#: History entries an item keeps: the first (submission) and the latest ones. A job preempted thousands of
#: times keeps a bounded item; its counters (attempt, preemptions, loans_taken_back, retries,
#: attempts_ended, seconds_trained) keep the totals.
HISTORY_KEPT = 40
#: Longest reason stored (in the job and in each history entry); SageMaker's FailureReason can be long.
REASON_MAX_CHARS = 400


def _job_pk(name: str) -> str:
    return f"JOB#{name}"


def _external_pk(training_job_name: str) -> str:
    return f"EXTERNAL#{training_job_name}"


def _warm_pk(training_job_name: str) -> str:
    return f"WARM#{training_job_name}"


def _claim_pk(kind: str, subject: str) -> str:
    return f"CLAIM#{kind}#{subject}"


def _forecast_pk(job_name: str) -> str:
    return f"FORECAST#{job_name}"


def _forecast_log_pk(pool: str) -> str:
    return f"FORECASTS#{pool}"


def queue_order(priority: int, submitted_at: datetime, name: str) -> str:
    """Sort key that orders a pool's queue: highest priority first, then oldest submission, then name.

    Priorities are inverted and zero-padded so that an ascending string sort is the queue's order.
    """
    return f"{PRIORITY_MAX - priority:05d}#{_stamp(submitted_at)}#{name}"


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --- domain objects the store returns besides Job and Pool -------------------------------------------------


@dataclass(frozen=True)
class ExternalAttempt:
    """A training job started outside the queue on a managed pool: it holds instances the queue cannot use."""

    training_job_name: str
    demand: Mapping[str, int]
    started_at: datetime


@dataclass(frozen=True)
class TrackedWarmPool:
    """An Available warm pool left by a finished attempt, until `expires_at` (its keep-alive)."""

    training_job_name: str
    resource_key: ResourceKey
    expires_at: datetime
    job_name: str | None = None


@dataclass(frozen=True)
class PoolStatus:
    pool: Pool
    queued: int
    #: instances SageMaker held in this pool when it last refused a create with ResourceLimitExceeded:
    #: the account's quota, as far as sagequeue has seen it; None when never refused
    quota: int | None = None
    quota_seen_at: datetime | None = None
    #: how long the quota is planned with: longer when SageMaker stated it than when it was guessed
    quota_memory_seconds: int = QUOTA_MEMORY_SECONDS

    def quota_at(self, now: datetime) -> int | None:
        """The account quota to plan with, when SageMaker refused a start recently enough; else None."""
        return active_quota(self.quota, self.quota_seen_at, now, self.quota_memory_seconds)

    #: jobs that recently left the queue for a live state: (when, job name). The live index may not show
    #: them yet (GSIs are eventually consistent); a pass reads them by key.
    recent_starts: tuple[tuple[datetime, str], ...] = ()
    #: bumped by every start recorded on the pool: a start is recorded only if the pool's ledger is still the
    #: one its pass planned on (two passes racing cannot both start on one instance)
    ledger: int = 0
    #: instances of this type SageMaker kept in Available warm pools when it last did not retain a pool
    #: (its warm-pool quota, 0 by default on AWS, as far as sagequeue has seen it); None when never seen
    warm_quota: int | None = None
    warm_quota_seen_at: datetime | None = None

    def warm_quota_at(self, now: datetime) -> int | None:
        """The warm-pool quota to plan keep-alives with, when SageMaker dropped a pool recently enough."""
        return active_quota(self.warm_quota, self.warm_quota_seen_at, now, QUOTA_MEMORY_SECONDS)


@dataclass
class Page:
    jobs: list[Job] = field(default_factory=list)
    next_token: str | None = None


# --- the model (one class for every item type: one table, one connection, one client) -------------------------


def _model_classes(table_name: str, host: str | None, region: str | None) -> Any:
    """A model class bound to `table_name` at `host`: each repository gets its own, so tests and the local
    stack can hold several tables and endpoints in one process."""

    class _Index(GlobalSecondaryIndex[Any]):
        pass

    def index(name: str, hash_attr: str, range_attr: str | None) -> GlobalSecondaryIndex[Any]:
        attrs: dict[str, Any] = {
            "Meta": type("Meta", (), {"index_name": name, "projection": AllProjection()}),
            hash_attr: UnicodeAttribute(hash_key=True),
        }
        if range_attr is not None:
            attrs[range_attr] = UnicodeAttribute(range_key=True)
        return type(f"Index_{name}", (_Index,), attrs)()

    meta = type("Meta", (), {"table_name": table_name, "host": host, "region": region})

    class Item(Model):
        Meta = meta  # type: ignore[assignment]  # built per table, at runtime
        pk = UnicodeAttribute(hash_key=True)
        sk = UnicodeAttribute(range_key=True)
        version = VersionAttribute()
        # job
        name = UnicodeAttribute(null=True)
        request = UnicodeAttribute(null=True)  # the CreateTrainingJob request, JSON
        priority = NumberAttribute(null=True)
        owner = UnicodeAttribute(null=True)
        submitted_at = UTCDateTimeAttribute(null=True)
        state = UnicodeAttribute(null=True)
        pool = UnicodeAttribute(null=True)
        attempt = NumberAttribute(null=True)
        training_job_name = UnicodeAttribute(null=True)
        started_at = UTCDateTimeAttribute(null=True)
        ended_at = UTCDateTimeAttribute(null=True)
        reason = UnicodeAttribute(null=True)
        stop_reason = UnicodeAttribute(null=True)
        preemptions = NumberAttribute(null=True)
        loans_taken_back = NumberAttribute(null=True)
        retries = NumberAttribute(null=True)
        attempts_ended = NumberAttribute(null=True)
        seconds_trained = NumberAttribute(null=True)
        counted_attempt = NumberAttribute(null=True)
        not_before = UTCDateTimeAttribute(null=True)
        reused_warm_pool_of = UnicodeAttribute(null=True)
        keep_alive_seconds = NumberAttribute(null=True)
        on_loan_for = UnicodeAttribute(null=True)
        training_started_at = UTCDateTimeAttribute(null=True)
        queued_since = UTCDateTimeAttribute(null=True)
        reservation = UnicodeAttribute(null=True)  # JSON {instances, since, kind}
        team = UnicodeAttribute(null=True)
        capacity_wait = UnicodeAttribute(null=True)  # JSON {kind, since}
        capacity_requeues = NumberAttribute(null=True)
        attempt_secret = UnicodeAttribute(null=True)
        checkpoint = UnicodeAttribute(null=True)  # JSON CheckpointRecord of the current attempt
        history = UnicodeAttribute(null=True)  # JSON list
        # index keys
        queued_pool = UnicodeAttribute(null=True)
        queue_order = UnicodeAttribute(null=True)
        queued_instances = NumberAttribute(null=True)  # instances the queued job needs in queued_pool
        queued_team_pool = UnicodeAttribute(null=True)  # <team>#<pool> of a queued job that has a team
        live_kind = UnicodeAttribute(null=True)
        live_name = UnicodeAttribute(null=True)
        submitted_order = UnicodeAttribute(null=True)
        # pool
        capacity = NumberAttribute(null=True)
        queued = NumberAttribute(null=True)
        quota = NumberAttribute(null=True)
        quota_seen_at = UTCDateTimeAttribute(null=True)
        quota_memory = NumberAttribute(null=True)  # seconds the quota is planned with
        warm_quota = NumberAttribute(null=True)
        warm_quota_seen_at = UTCDateTimeAttribute(null=True)
        recent = UnicodeSetAttribute(null=True)  # "<epoch seconds>#<job name>" of recent starts
        ledger = NumberAttribute(null=True)  # starts recorded on the pool (PoolStatus.ledger)
        # team quota (team and pool in the key; a null limit is unlimited)
        nominal = NumberAttribute(null=True)
        borrowing_limit = NumberAttribute(null=True)
        lending_limit = NumberAttribute(null=True)
        # external attempt, warm pool, claim
        demand = UnicodeAttribute(null=True)  # JSON {instance type: count}
        resource_key = UnicodeAttribute(null=True)  # JSON
        detail = UnicodeAttribute(null=True)  # JSON
        claimed_at = UTCDateTimeAttribute(null=True)
        expires_at = NumberAttribute(null=True)  # epoch seconds, the table's TTL attribute
        # start forecast (latest or logged); its pool is not `pool`, which would put it in by_pool
        forecast_pool = UnicodeAttribute(null=True)
        made_at = UTCDateTimeAttribute(null=True)
        p10 = UTCDateTimeAttribute(null=True)
        p50 = UTCDateTimeAttribute(null=True)
        p90 = UTCDateTimeAttribute(null=True)
        runs = NumberAttribute(null=True)
        logged_at = UTCDateTimeAttribute(null=True)  # latest: when its job last went to the log
        outcome_at = UTCDateTimeAttribute(null=True)  # logged: the start that followed
        gone = NumberAttribute(null=True)  # logged: 1 when its job ended without starting
        engine_p10 = UTCDateTimeAttribute(null=True)  # the engine's own quantiles, where those shown are
        engine_p50 = UTCDateTimeAttribute(null=True)  # calibrated (ADR 0026)
        engine_p90 = UTCDateTimeAttribute(null=True)
        calibrated = NumberAttribute(null=True)  # 1: p10-p90 are calibrated, engine_* the engine's

        queued_index = index("queued", "queued_pool", "queue_order")
        queued_team_index = index("queued_team", "queued_team_pool", "queue_order")
        live_index = index("live", "live_kind", "live_name")
        owner_index = index("by_owner", "owner", "submitted_order")
        state_index = index("by_state", "state", "submitted_order")
        pool_index = index("by_pool", "pool", "submitted_order")
        training_job_index = index("by_training_job", "training_job_name", None)

    return Item


def _ledger_is(item: Any, expected: int) -> Any:
    """The pool item's ledger is `expected` (never written counts as 0)."""
    if expected <= 0:
        return item.ledger.does_not_exist() | (item.ledger == 0)
    return item.ledger == expected


def _pool_condition_failed(exc: Exception) -> bool:
    """A cancelled start's transaction failed on a pool's ledger, not on the job (the first item)."""
    reasons = list(getattr(exc, "cancellation_reasons", None) or [])
    return any(getattr(r, "code", None) == "ConditionalCheckFailed" for r in reasons[1:] if r is not None)


def _condition_failed(exc: Exception) -> bool:
    cause = getattr(exc, "cause_response_code", None)
    if cause == _CONDITION_FAILED:
        return True
    reasons = getattr(exc, "cancellation_reasons", None) or []
    # a cancelled transaction names each item's reason without the "Exception" suffix
    return any(getattr(r, "code", None) == "ConditionalCheckFailed" for r in reasons if r is not None)


#: Per-item codes of a cancelled transaction that mean "this item changed under us" (DynamoDB drops the
#: "Exception" suffix there); "None" marks an item that was fine.
_LOST_RACE_CODES = frozenset({"ConditionalCheckFailed", "TransactionConflict"})


def _without_lost_races(pending: list[Any], exc: TransactWriteError) -> list[Any]:
    """`pending` without the items a cancelled transaction names as changed; re-raise any other failure."""
    reasons = list(getattr(exc, "cancellation_reasons", None) or [])
    codes = [getattr(reason, "code", None) for reason in reasons]
    if len(codes) != len(pending) or not any(code in _LOST_RACE_CODES for code in codes):
        raise exc
    if any(code not in _LOST_RACE_CODES and code not in (None, "None") for code in codes):
        raise exc
    return [item for item, code in zip(pending, codes, strict=True) if code not in _LOST_RACE_CODES]


class Repository:
    """sagequeue's table. `host` is an endpoint URL (moto, DynamoDB Local); None means AWS."""

    def __init__(self, table_name: str, *, host: str | None = None, region: str | None = None) -> None:
        self.table_name = table_name
        self._item: Any = _model_classes(table_name, host, region)
        self._host = host
        self._region = region

    # the client, for instrumentation (request counting in tests, X-Ray patches)
    @property
    def client(self) -> Any:
        return self._item._get_connection().connection.client

    # --- jobs ---------------------------------------------------------------------------------------------

    def create_job(self, job: Job) -> Job:
        """Store a new queue entry; JobAlreadyExists when the name is taken."""
        item = self._job_item(job, new=True)
        try:
            if job.state is JobState.QUEUED:
                with self._transaction() as tx:
                    tx.save(item)
                    tx.update(
                        self._item(_POOLS_PK, job.pool),
                        actions=[self._item.queued.add(1)],
                        condition=self._item.pk.exists(),
                        add_version_condition=False,
                    )
            else:
                item.save()
        except (PutError, TransactWriteError) as exc:
            if _condition_failed(exc):
                if self.find_job(job.name) is not None:
                    raise JobAlreadyExists(f"a job named {job.name!r} already exists") from None
                raise PoolNotFound(f"no pool for instance type {job.pool}") from None
            raise
        job.version = 1
        return job

    def get_job(self, name: str) -> Job:
        job = self.find_job(name)
        if job is None:
            raise JobNotFound(f"no job named {name!r}")
        return job

    def find_job(self, name: str) -> Job | None:
        try:
            item = self._item.get(_job_pk(name), _JOB_SK, consistent_read=True)
        except self._item.DoesNotExist:
            return None
        return self._to_job(item)

    def save_job(self, job: Job, *, was: JobState, ledger: Mapping[str, int] | None = None) -> Job:
        """Write `job` if nobody changed it since it was read (its version); StaleVersion otherwise.

        `was` is the state the job had when read: entering or leaving the queue moves the pool's counter
        in the same transaction, so the counter cannot drift from the queue. `ledger`: the ledger of each
        pool the start uses as its pass read it (PoolStatus.ledger); the write goes through only if none
        moved since, and moves them (LedgerMoved otherwise).
        """
        item = self._job_item(job)
        entering = job.state is JobState.QUEUED and was is not JobState.QUEUED
        leaving = was is JobState.QUEUED and job.state is not JobState.QUEUED
        pools: dict[str, list[Any]] = {}
        if entering or leaving:
            pools[job.pool] = [self._item.queued.add(1 if entering else -1)]
            if leaving and job.state.is_live:
                stamp = int((job.started_at or datetime.now(UTC)).timestamp())
                pools[job.pool].append(self._item.recent.add({f"{stamp}#{job.name}"}))
        for pool in ledger or {}:
            pools.setdefault(pool, []).append(self._item.ledger.add(1))
        try:
            if pools:
                with self._transaction() as tx:
                    tx.save(item)
                    for pool, actions in pools.items():
                        tx.update(
                            self._item(_POOLS_PK, pool),
                            actions=actions,
                            condition=_ledger_is(self._item, ledger[pool])
                            if ledger and pool in ledger
                            else None,
                            add_version_condition=False,
                        )
            else:
                item.save()
        except (PutError, TransactWriteError) as exc:
            if ledger and _pool_condition_failed(exc):
                raise LedgerMoved(
                    f"a pool of job {job.name!r} was started on since the pass read it"
                ) from None
            if _condition_failed(exc):
                raise StaleVersion(
                    f"job {job.name!r} changed since it was read (version {job.version})"
                ) from None
            raise
        job.version += 1
        return job

    def note_waiting(self, notes: Sequence[tuple[Job, str | None, Reservation | None]]) -> list[str]:
        """Set each queued job's `reason` (why it waits) and reservation (what a pass promised it), many
        per request; the names written.

        Both are written only on the job as it was read (its version), without moving the version, so they
        never make a concurrent change of the job stale: a cancel, a hold or a start that wins the race
        writes the whole job, reservation cleared. A job changed since it was read keeps its old values (the
        next pass decides again). Up to TRANSACTION_ITEMS jobs go in one TransactWriteItems request; when
        some of them were changed, the request is cancelled as a whole and sent again without them.
        """
        written: list[str] = []
        for start in range(0, len(notes), TRANSACTION_ITEMS):
            pending = list(notes[start : start + TRANSACTION_ITEMS])
            while pending:
                try:
                    with self._transaction() as tx:
                        for job, reason, reservation in pending:
                            tx.update(
                                self._item(_job_pk(job.name), _JOB_SK),
                                actions=[
                                    self._item.reason.set(reason) if reason else self._item.reason.remove(),
                                    self._item.reservation.set(json.dumps(reservation.to_dict()))
                                    if reservation
                                    else self._item.reservation.remove(),
                                ],
                                condition=self._item.version == job.version,
                                add_version_condition=False,
                            )
                except TransactWriteError as exc:
                    pending = _without_lost_races(pending, exc)
                    continue
                for job, reason, reservation in pending:
                    job.reason = reason
                    job.reservation = reservation
                    written.append(job.name)
                pending = []
        return written

    def note_checkpoints(self, records: Sequence[tuple[Job, CheckpointRecord]]) -> list[str]:
        """Set each live job's checkpoint record (docs/adr/0025), many per request; the names written.

        Like `note_waiting`: written only on the job as it was read (its version), without moving the
        version, so a read of a marker never makes a concurrent change of the job stale; a job changed since
        keeps its old record, and the next pass reads the marker again.
        """
        written: list[str] = []
        for start in range(0, len(records), TRANSACTION_ITEMS):
            pending = list(records[start : start + TRANSACTION_ITEMS])
            while pending:
                try:
                    with self._transaction() as tx:
                        for job, record in pending:
                            tx.update(
                                self._item(_job_pk(job.name), _JOB_SK),
                                actions=[self._item.checkpoint.set(json.dumps(record.to_dict()))],
                                condition=self._item.version == job.version,
                                add_version_condition=False,
                            )
                except TransactWriteError as exc:
                    pending = _without_lost_races(pending, exc)
                    continue
                for job, record in pending:
                    job.checkpoint = record
                    written.append(job.name)
                pending = []
        return written

    def find_job_by_training_job(self, training_job_name: str) -> Job | None:
        """The queue entry whose current attempt is `training_job_name`."""
        for item in self._item.training_job_index.query(training_job_name):
            if item.pk.startswith("JOB#"):
                return self._to_job(item)
        return None

    def queued_jobs(
        self, pool: str, limit: int, *, fitting: int | None = None, team: str | None = None
    ) -> list[Job]:
        """The first `limit` queued jobs of `pool` in queue order: one Query, whatever the queue's length.

        With `fitting`, jobs that need more than that many instances of the pool are passed over (they can
        never start while the capacity stays below it), so they cannot fill the window. With `team`, only
        that team's jobs (its own window, for fair share across teams).
        """
        condition = None
        if fitting is not None:
            condition = self._item.queued_instances.does_not_exist() | (
                self._item.queued_instances <= fitting
            )
        if team is not None:
            items = self._item.queued_team_index.query(
                f"{team}{_TEAM_SEP}{pool}", filter_condition=condition, limit=limit, page_size=limit
            )
        else:
            items = self._item.queued_index.query(
                pool, filter_condition=condition, limit=limit, page_size=limit
            )
        return _readable(items, self._to_job)

    def queued_count(self, pool: str, team: str) -> int:
        """How many of `team`'s jobs wait in `pool` (a Count on the team's window index)."""
        return int(self._item.queued_team_index.count(f"{team}{_TEAM_SEP}{pool}"))

    def queued_by_team(self, pool: str) -> dict[str, int]:
        """How many jobs of each team wait in `pool`, under "" those without a team: one Query on the pool's
        queue window that reads only each job's team, in pages of 1 MB. Jobs without a team have no team
        window to count (queued_team_pool is a team's), and a job queued by any earlier version carries
        its pool's window and its team, so this counts every queued job, with no counter to keep or
        backfill. It reads the pool's whole queue, as queued_count reads a team's: for the API's listing of
        teams, never for a pass."""
        counts: dict[str, int] = {}
        for item in self._item.queued_index.query(pool, attributes_to_get=["team"]):
            team = item.team or ""
            counts[team] = counts.get(team, 0) + 1
        return counts

    def queue_position(self, job: Job) -> int | None:
        """1-based place of a queued job among its pool's queued jobs."""
        if job.state is not JobState.QUEUED:
            return None
        order = queue_order(job.priority, job.submitted_at, job.name)
        ahead = self._item.queued_index.count(job.pool, self._item.queue_order < order)
        return ahead + 1

    def live_jobs(self) -> list[Job]:
        """Jobs whose attempt holds instances (starting, running, preempting, stopping). An item that does
        not read as a job is logged, counted and skipped: one poisoned job must not stop a pass."""
        return _readable(
            self._item.live_index.query(_LIVE, self._item.live_name.startswith("JOB#")), self._to_job
        )

    def list_jobs(
        self,
        *,
        owner: str | None = None,
        state: JobState | None = None,
        pool: str | None = None,
        limit: int = 50,
        next_token: str | None = None,
        newest_first: bool = False,
    ) -> Page:
        """Jobs by owner, state or pool (the first given picks the index, the others filter), in submission
        order: oldest first, or with `newest_first` newest first (a page token goes on in the same order)."""
        filters = []
        if owner is not None:
            index, key = self._item.owner_index, owner
            if state is not None:
                filters.append(self._item.state == state.value)
            if pool is not None:
                filters.append(self._item.pool == pool)
        elif state is not None:
            index, key = self._item.state_index, state.value
            if pool is not None:
                filters.append(self._item.pool == pool)
        elif pool is not None:
            index, key = self._item.pool_index, pool
        else:
            raise ValueError("list_jobs needs an owner, a state or a pool")
        condition = None
        for extra in filters:
            condition = extra if condition is None else condition & extra
        result = index.query(
            key,
            filter_condition=condition,
            limit=limit,
            page_size=limit,
            last_evaluated_key=_decode_token(next_token, self._token_shape(index), key),
            scan_index_forward=not newest_first,
        )
        jobs = [self._to_job(item) for item in result]
        last = result.last_evaluated_key
        return Page(jobs=jobs, next_token=_encode_token(last) if last else None)

    def _token_shape(self, index: Any) -> tuple[frozenset[str], str]:
        """The attribute names a page token of `index` holds, and the name of the index's partition key."""
        model = self._item
        names = {model._hash_keyname, model._range_keyname}
        index_keys = [attr.attr_name for attr in index.Meta.attributes.values() if attr.is_hash_key]
        index_keys += [attr.attr_name for attr in index.Meta.attributes.values() if attr.is_range_key]
        names.update(index_keys)
        return frozenset(name for name in names if name), index_keys[0]

    def import_jobs(self, jobs: Sequence[Job]) -> None:
        """Bulk-load queued jobs (a migration, a benchmark) with batch writes; counts them into their pools."""
        per_pool: dict[str, int] = {}
        with self._item.batch_write() as batch:
            for job in jobs:
                item = self._job_item(job, new=True)
                item.version = 1
                batch.save(item)
                if job.state is JobState.QUEUED:
                    per_pool[job.pool] = per_pool.get(job.pool, 0) + 1
                job.version = 1
        for pool, count in per_pool.items():
            self._item(_POOLS_PK, pool).update(
                actions=[self._item.queued.add(count)], add_version_condition=False
            )

    # --- pools --------------------------------------------------------------------------------------------

    def pools(self) -> list[PoolStatus]:
        """Every pool (a consistent Query on the table, not an index)."""
        return self.pools_and_teams()[0]

    def pools_and_teams(self) -> tuple[list[PoolStatus], list[TeamQuota], UsageCounter | None]:
        """Every pool, every team quota and the fair-share counter, in one consistent Query."""
        from sagequeue_core.quotas import TeamQuota, UsageCounter

        pools: list[PoolStatus] = []
        quotas: list[TeamQuota] = []
        counter: UsageCounter | None = None
        for item in self._item.query(_POOLS_PK, consistent_read=True):
            if item.sk == _USAGE_SK:
                detail = json.loads(item.detail or "{}")
                counter = UsageCounter(
                    as_of=item.claimed_at, hours={str(k): float(v) for k, v in detail.items()}
                )
            elif item.sk.startswith(_TEAM_PREFIX):
                team, _, pool = item.sk[len(_TEAM_PREFIX) :].partition(_TEAM_SEP)
                quotas.append(
                    TeamQuota(
                        team=team,
                        pool=pool,
                        nominal=int(item.nominal or 0),
                        borrowing_limit=None if item.borrowing_limit is None else int(item.borrowing_limit),
                        lending_limit=None if item.lending_limit is None else int(item.lending_limit),
                        check_name=False,  # stored: the name rule may postdate it
                    )
                )
            else:
                pools.append(self._to_pool(item))
        return pools, quotas, counter

    def forget_recent_starts(self, instance_type: str, entries: Sequence[tuple[datetime, str]]) -> None:
        """Drop entries of `recent_starts` old enough for every index to show them."""
        if entries:
            values = {f"{int(at.timestamp())}#{name}" for at, name in entries}
            self._item(_POOLS_PK, instance_type).update(
                actions=[self._item.recent.delete(values)], add_version_condition=False
            )

    def get_pool(self, instance_type: str) -> PoolStatus:
        try:
            item = self._item.get(_POOLS_PK, instance_type, consistent_read=True)
        except self._item.DoesNotExist:
            raise PoolNotFound(f"no pool for instance type {instance_type}") from None
        return self._to_pool(item)

    def record_quota(
        self, instance_type: str, instances: int, at: datetime, memory_seconds: int = QUOTA_MEMORY_SECONDS
    ) -> None:
        """Remember that SageMaker refused a create at a quota of `instances` for the account (planned with
        for `memory_seconds`)."""
        self._item(_POOLS_PK, instance_type).update(
            actions=[
                self._item.quota.set(instances),
                self._item.quota_seen_at.set(at),
                self._item.quota_memory.set(memory_seconds),
            ],
            condition=self._item.pk.exists(),
            add_version_condition=False,
        )

    def forget_quota(self, instance_type: str) -> None:
        """SageMaker granted more than the quota sagequeue had seen (raised, or freed elsewhere)."""
        self._item(_POOLS_PK, instance_type).update(
            actions=[
                self._item.quota.remove(),
                self._item.quota_seen_at.remove(),
                self._item.quota_memory.remove(),
            ],
            condition=self._item.pk.exists(),
            add_version_condition=False,
        )

    def record_warm_quota(self, instance_type: str, instances: int, at: datetime) -> None:
        """Remember that SageMaker did not retain a warm pool while it kept `instances` of this type in
        Available pools for the account: its warm-pool quota."""
        self._item(_POOLS_PK, instance_type).update(
            actions=[self._item.warm_quota.set(instances), self._item.warm_quota_seen_at.set(at)],
            condition=self._item.pk.exists(),
            add_version_condition=False,
        )

    def forget_warm_quota(self, instance_type: str) -> None:
        """SageMaker retained more than the warm-pool quota sagequeue had seen (it was raised)."""
        self._item(_POOLS_PK, instance_type).update(
            actions=[self._item.warm_quota.remove(), self._item.warm_quota_seen_at.remove()],
            condition=self._item.pk.exists(),
            add_version_condition=False,
        )

    @staticmethod
    def _to_pool(item: Any) -> PoolStatus:
        return PoolStatus(
            Pool(item.sk, int(item.capacity or 0)),
            max(int(item.queued or 0), 0),
            quota=None if item.quota is None else int(item.quota),
            quota_seen_at=item.quota_seen_at,
            quota_memory_seconds=int(item.quota_memory or QUOTA_MEMORY_SECONDS),
            recent_starts=tuple(sorted(_recent(item.recent))),
            ledger=int(item.ledger or 0),
            warm_quota=None if item.warm_quota is None else int(item.warm_quota),
            warm_quota_seen_at=item.warm_quota_seen_at,
        )

    def set_capacity(self, pool: Pool) -> PoolStatus:
        """Create the pool or change its capacity (its queued counter is kept)."""
        item = self._item(_POOLS_PK, pool.instance_type)
        item.update(
            actions=[self._item.capacity.set(pool.capacity), self._item.queued.add(0)],
            add_version_condition=False,
        )
        return self.get_pool(pool.instance_type)

    def seed_pools(self, capacity: Mapping[str, int]) -> None:
        """Create the configured pools that do not exist yet; capacity changed at runtime is kept."""
        for instance_type, count in capacity.items():
            item = self._item(_POOLS_PK, instance_type, capacity=count, queued=0)
            try:
                item.save(condition=self._item.pk.does_not_exist(), add_version_condition=False)
            except PutError as exc:
                if not _condition_failed(exc):
                    raise

    # --- team quotas and the fair-share counter ---------------------------------------------------------

    def team_quotas(self) -> list[TeamQuota]:
        """Every team's quota in every pool."""
        return self.pools_and_teams()[1]

    def teams(self) -> tuple[list[TeamQuota], UsageCounter | None]:
        """The quotas and the decaying usage counter, in one read."""
        _, quotas, counter = self.pools_and_teams()
        return quotas, counter

    def set_team_quota(self, quota: TeamQuota) -> TeamQuota:
        """Create or replace a team's quota in a pool."""
        self._item(
            _TEAMS_PK,
            f"{_TEAM_PREFIX}{quota.team}{_TEAM_SEP}{quota.pool}",
            nominal=quota.nominal,
            borrowing_limit=quota.borrowing_limit,
            lending_limit=quota.lending_limit,
        ).save(add_version_condition=False)
        return quota

    def remove_team_quota(self, team: str, pool: str) -> bool:
        """Drop a team's quota in a pool; False if it had none."""
        try:
            self._item(_TEAMS_PK, f"{_TEAM_PREFIX}{team}{_TEAM_SEP}{pool}").delete(
                condition=self._item.pk.exists(), add_version_condition=False
            )
        except DeleteError as exc:
            if _condition_failed(exc):
                return False
            raise
        return True

    def save_usage_counter(self, counter: UsageCounter, *, was: UsageCounter | None) -> bool:
        """Store the advanced counter if nobody advanced it since `was` was read; False on a lost race
        (the other pass's counter stands, and this pass's interval is counted by the next one)."""
        item = self._item(
            _TEAMS_PK,
            _USAGE_SK,
            detail=json.dumps(dict(counter.hours), separators=(",", ":")),
            claimed_at=counter.as_of,
        )
        condition = self._item.pk.does_not_exist() if was is None else (self._item.claimed_at == was.as_of)
        try:
            item.save(condition=condition, add_version_condition=False)
        except PutError as exc:
            if _condition_failed(exc):
                return False
            raise
        return True

    # --- attempts started outside the queue ---------------------------------------------------------------

    def record_external_attempt(self, attempt: ExternalAttempt) -> None:
        item = self._item(
            _external_pk(attempt.training_job_name),
            _LIVE,
            training_job_name=attempt.training_job_name,
            live_kind=_LIVE,
            live_name=f"EXTERNAL#{attempt.training_job_name}",
            demand=json.dumps(dict(attempt.demand)),
            started_at=attempt.started_at,
        )
        item.save(add_version_condition=False)

    def forget_external_attempt(self, training_job_name: str) -> None:
        self._item(_external_pk(training_job_name), _LIVE).delete(add_version_condition=False)

    def external_attempts(self) -> list[ExternalAttempt]:
        return [
            ExternalAttempt(
                training_job_name=item.training_job_name or "",
                demand=json.loads(item.demand or "{}"),
                started_at=item.started_at or datetime.now(UTC),
            )
            for item in self._item.live_index.query(_LIVE, self._item.live_name.startswith("EXTERNAL#"))
        ]

    # --- warm pools ---------------------------------------------------------------------------------------

    def track_warm_pool(self, warm: TrackedWarmPool) -> None:
        item = self._item(
            _warm_pk(warm.training_job_name),
            _WARM,
            live_kind=_WARM,
            live_name=warm.training_job_name,
            resource_key=json.dumps(warm.resource_key.to_dict()),
            name=warm.job_name,
            expires_at=int(warm.expires_at.timestamp()),
        )
        item.save(add_version_condition=False)

    def forget_warm_pool(self, training_job_name: str) -> bool:
        """Stop tracking a warm pool; False when it was not tracked (someone else took it first)."""
        try:
            self._item(_warm_pk(training_job_name), _WARM).delete(
                condition=self._item.pk.exists(), add_version_condition=False
            )
        except DeleteError as exc:
            if _condition_failed(exc):
                return False
            raise
        return True

    def warm_pools(self) -> list[TrackedWarmPool]:
        return [
            TrackedWarmPool(
                training_job_name=item.live_name or "",
                resource_key=ResourceKey.from_dict(json.loads(item.resource_key or "{}")),
                expires_at=datetime.fromtimestamp(int(item.expires_at or 0), UTC),
                job_name=item.name,
            )
            for item in self._item.live_index.query(_WARM)
        ]

    # --- idempotency ledger -------------------------------------------------------------------------------

    def claim(self, kind: str, subject: str, detail: Mapping[str, Any] | None = None) -> bool:
        """Record that `kind` was done for `subject`; True the first time only (a conditional put)."""
        item = self._item(
            _claim_pk(kind, subject),
            _CLAIM_SK,
            detail=json.dumps(dict(detail or {}), default=str),
            claimed_at=datetime.now(UTC),
        )
        try:
            item.save(condition=self._item.pk.does_not_exist(), add_version_condition=False)
        except PutError as exc:
            if _condition_failed(exc):
                return False
            raise
        return True

    def get_claim(self, kind: str, subject: str) -> dict[str, Any] | None:
        """The detail recorded by the first claim of (`kind`, `subject`), or None if never claimed."""
        try:
            item = self._item.get(_claim_pk(kind, subject), _CLAIM_SK, consistent_read=True)
        except self._item.DoesNotExist:
            return None
        detail: dict[str, Any] = json.loads(item.detail or "{}")
        return detail

    # --- start forecasts (sagequeue_core.forecasts) --------------------------------------------------------

    def save_forecasts(
        self,
        latest: Sequence[tuple[StartForecast, datetime | None]],
        logged: Sequence[StartForecast] = (),
        calibration: tuple[Mapping[str, Any], datetime] | None = None,
    ) -> None:
        """Store each job's latest forecast with when its job last went to the log (replacing the one
        before), append `logged` to the log, and keep `calibration` (what the forecasts were calibrated
        with, and when it was learnt) for clients that forecast themselves; all expire after KEEP_SECONDS."""
        from sagequeue_core.forecasts import KEEP_SECONDS

        with self._item.batch_write() as batch:
            if calibration is not None:
                detail, learnt_at = calibration
                batch.save(
                    self._item(
                        _FORECAST_CALIBRATION_PK,
                        _FORECAST_CALIBRATION_SK,
                        detail=json.dumps(detail, sort_keys=True),
                        made_at=learnt_at,
                        expires_at=int(learnt_at.timestamp()) + KEEP_SECONDS,
                    )
                )
            for made, logged_at in latest:
                batch.save(
                    self._forecast_item(made, _forecast_pk(made.job), _FORECAST_SK, logged_at=logged_at)
                )
            for made in logged:
                batch.save(
                    self._forecast_item(
                        made, _forecast_log_pk(made.pool), f"{_stamp(made.made_at)}#{made.job}"
                    )
                )

    def forecast_calibration(self) -> tuple[dict[str, Any], datetime] | None:
        """The calibration the forecast function last stored, and when it was learnt; None: none yet."""
        try:
            item = self._item.get(_FORECAST_CALIBRATION_PK, _FORECAST_CALIBRATION_SK)
        except self._item.DoesNotExist:
            return None
        except (ValueError, TypeError) as exc:  # an attribute no version of this code wrote
            _skipped(_FORECAST_CALIBRATION_PK, exc)
            return None
        try:
            detail = json.loads(item.detail or "{}")
        except ValueError:
            return None
        if not isinstance(detail, dict) or item.made_at is None:
            return None
        return detail, item.made_at

    def job_forecast(self, job_name: str) -> tuple[StartForecast, datetime | None] | None:
        """A job's latest forecast and when its job last went to the log, or None."""
        try:
            item = self._item.get(_forecast_pk(job_name), _FORECAST_SK)
        except self._item.DoesNotExist:
            return None
        except (ValueError, TypeError) as exc:  # an attribute no version of this code wrote
            _skipped(_forecast_pk(job_name), exc)
            return None
        readable = _readable([item], self._to_forecast)  # an item cut short is no forecast, not an error
        return (readable[0], item.logged_at) if readable else None

    def job_forecasts(self, job_names: Iterable[str]) -> dict[str, tuple[StartForecast, datetime | None]]:
        """The latest forecasts of these jobs (BatchGetItem), by job."""
        names = list(dict.fromkeys(job_names))
        keys = [(_forecast_pk(name), _FORECAST_SK) for name in names]
        try:
            items = [item for item in self._item.batch_get(keys) if item.name]
        except (ValueError, TypeError):
            # one item no version of this code wrote fails the batch: read them one by one, skipping it
            found = (self.job_forecast(name) for name in names)
            return {stored[0].job: stored for stored in found if stored is not None}
        return {
            made.job: (made, item.logged_at)
            for item in items
            for made in _readable([item], self._to_forecast)
        }

    def past_forecasts(self, pool: str, since: datetime, limit: int) -> list[PastForecast]:
        """Logged forecasts of `pool` made since `since`, newest first, at most `limit`."""
        items = self._item.query(
            _forecast_log_pk(pool),
            self._item.sk >= _stamp(since),
            scan_index_forward=False,
            limit=limit,
            page_size=min(limit, 500),
        )
        return _readable(items, self._to_past_forecast)

    def settle_forecasts(self, settled: Sequence[PastForecast]) -> None:
        """Record what came of logged forecasts (the start that followed, or that their job is gone)."""
        with self._item.batch_write() as batch:
            for entry in settled:
                made = entry.forecast
                batch.save(
                    self._forecast_item(
                        made,
                        _forecast_log_pk(made.pool),
                        f"{_stamp(made.made_at)}#{made.job}",
                        outcome_at=entry.started_at,
                        gone=1 if entry.gone else None,
                    )
                )

    def _forecast_item(self, made: StartForecast, pk: str, sk: str, **extra: Any) -> Any:
        from sagequeue_core.forecasts import KEEP_SECONDS

        return self._item(
            pk,
            sk,
            name=made.job,
            forecast_pool=made.pool,
            attempt=made.attempt,
            made_at=made.made_at,
            p10=made.p10,
            p50=made.p50,
            p90=made.p90,
            runs=made.runs,
            expires_at=int(made.made_at.timestamp()) + KEEP_SECONDS,
            calibrated=1 if made.engine is not None else None,
            engine_p10=made.engine[0] if made.engine is not None else None,
            engine_p50=made.engine[1] if made.engine is not None else None,
            engine_p90=made.engine[2] if made.engine is not None else None,
            **extra,
        )

    @staticmethod
    def _to_forecast(item: Any) -> StartForecast:
        from sagequeue_core.forecasts import StartForecast

        if not item.name or item.made_at is None:
            raise ValueError("a forecast item without its job or time")
        return StartForecast(
            job=item.name,
            pool=item.forecast_pool or "",
            attempt=int(item.attempt or 0),
            made_at=item.made_at,
            p10=item.p10,
            p50=item.p50,
            p90=item.p90,
            runs=int(item.runs or 0),
            engine=(item.engine_p10, item.engine_p50, item.engine_p90) if item.calibrated else None,
        )

    @classmethod
    def _to_past_forecast(cls, item: Any) -> PastForecast:
        from sagequeue_core.forecasts import PastForecast

        return PastForecast(cls._to_forecast(item), started_at=item.outcome_at, gone=bool(item.gone))

    # --- mapping ------------------------------------------------------------------------------------------

    def _transaction(self) -> TransactWrite:
        # the model's own connection, so one client (and its instrumentation) serves every request
        return TransactWrite(connection=self._item._get_connection().connection)

    def _job_item(self, job: Job, *, new: bool = False) -> Any:
        queued = job.state is JobState.QUEUED
        live = job.state.is_live
        item = self._item(
            _job_pk(job.name),
            _JOB_SK,
            name=job.name,
            request=json.dumps(job.request, separators=(",", ":")),
            priority=job.priority,
            owner=job.owner,
            submitted_at=job.submitted_at,
            state=job.state.value,
            pool=job.pool,
            attempt=job.attempt,
            training_job_name=job.training_job_name,
            started_at=job.started_at,
            ended_at=job.ended_at,
            reason=_clip(job.reason),
            stop_reason=job.stop_reason.value if job.stop_reason else None,
            preemptions=job.preemptions,
            loans_taken_back=job.loans_taken_back,
            retries=job.retries,
            attempts_ended=job.attempts_ended,
            seconds_trained=job.seconds_trained,
            counted_attempt=job.counted_attempt,
            not_before=job.not_before,
            reused_warm_pool_of=job.reused_warm_pool_of,
            keep_alive_seconds=job.keep_alive_seconds,
            on_loan_for=job.on_loan_for,
            training_started_at=job.training_started_at,
            queued_since=job.queued_since,
            reservation=json.dumps(job.reservation.to_dict()) if job.reservation else None,
            team=job.team,
            capacity_wait=json.dumps(job.capacity_wait.to_dict()) if job.capacity_wait else None,
            capacity_requeues=job.capacity_requeues or None,
            attempt_secret=job.attempt_secret,
            checkpoint=json.dumps(job.checkpoint.to_dict()) if job.checkpoint else None,
            history=json.dumps(_bounded_history(job.history), separators=(",", ":")),
            queued_pool=job.pool if queued else None,
            queue_order=queue_order(job.priority, job.submitted_at, job.name) if queued else None,
            queued_instances=job.demand[job.pool] if queued else None,
            queued_team_pool=f"{job.team}{_TEAM_SEP}{job.pool}" if queued and job.team else None,
            live_kind=_LIVE if live else None,
            live_name=_job_pk(job.name) if live else None,
            submitted_order=f"{_stamp(job.submitted_at)}#{job.name}",
        )
        if job.version and not new:
            item.version = job.version
        return item

    @staticmethod
    def _to_job(item: Any) -> Job:
        return Job(
            name=item.name,
            request=json.loads(item.request),
            priority=int(item.priority),
            owner=item.owner,
            submitted_at=item.submitted_at,
            state=JobState(item.state),
            attempt=int(item.attempt or 0),
            training_job_name=item.training_job_name,
            started_at=item.started_at,
            ended_at=item.ended_at,
            reason=item.reason,
            stop_reason=StopReason(item.stop_reason) if item.stop_reason else None,
            preemptions=int(item.preemptions or 0),
            loans_taken_back=int(item.loans_taken_back or 0),
            retries=int(item.retries or 0),
            attempts_ended=int(item.attempts_ended or 0),
            seconds_trained=int(item.seconds_trained or 0),
            counted_attempt=int(item.counted_attempt or 0),
            not_before=item.not_before,
            reused_warm_pool_of=item.reused_warm_pool_of,
            keep_alive_seconds=int(item.keep_alive_seconds or 0),
            on_loan_for=item.on_loan_for,
            training_started_at=item.training_started_at,
            queued_since=item.queued_since,
            reservation=Reservation.from_dict(json.loads(item.reservation)) if item.reservation else None,
            team=item.team,
            capacity_wait=CapacityWait.from_dict(json.loads(item.capacity_wait))
            if item.capacity_wait
            else None,
            capacity_requeues=int(item.capacity_requeues or 0),
            attempt_secret=item.attempt_secret,
            checkpoint=CheckpointRecord.from_dict(json.loads(item.checkpoint)) if item.checkpoint else None,
            version=int(item.version or 0),
            history=json.loads(item.history or "[]"),
        )


#: Page tokens are small (a few key attributes); anything longer is not one of ours.
_MAX_TOKEN_CHARS = 2048


def _readable(items: Iterable[Any], to_object: Callable[[Any], T]) -> list[T]:
    out: list[T] = []
    for item in items:
        try:
            out.append(to_object(item))
        except (ValueError, TypeError, KeyError) as exc:
            _skipped(getattr(item, "pk", None), exc)
    return out


def _skipped(pk: str | None, exc: Exception) -> None:
    observability.logger.error("unreadable item skipped", extra={"pk": pk, "error": str(exc)})
    observability.count(observability.SKIPPED_ON_ERROR)


def _recent(values: Iterable[str] | None) -> list[tuple[datetime, str]]:
    out = []
    for value in values or ():
        stamp, _, name = value.partition("#")
        if stamp.isdigit() and name:
            out.append((datetime.fromtimestamp(int(stamp), UTC), name))
    return out


def _clip(text: str | None) -> str | None:
    if text is None or len(text) <= REASON_MAX_CHARS:
        return text
    return text[: REASON_MAX_CHARS - 1] + "…"


def _bounded_history(history: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The first entry and the latest HISTORY_KEPT - 1, each reason clipped."""
    kept = list(history) if len(history) <= HISTORY_KEPT else [history[0], *history[-(HISTORY_KEPT - 1) :]]
    return [{**entry, "reason": _clip(entry.get("reason"))} for entry in kept]


def _encode_token(key: Mapping[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(key, separators=(",", ":")).encode()).decode()


def _decode_token(
    token: str | None, shape: tuple[frozenset[str], str] | None = None, partition: str | None = None
) -> dict[str, Any] | None:
    """The start key a page token carries; ValueError unless it has exactly the shape of a key of the index
    queried (`shape`: its attribute names and partition key) for the same partition, so a crafted token
    never reaches DynamoDB."""
    if not token:
        return None
    invalid = ValueError("next_token is not a token this API returned")
    if len(token) > _MAX_TOKEN_CHARS:
        raise invalid
    try:
        decoded = json.loads(base64.urlsafe_b64decode(token.encode("ascii")))
    except (ValueError, TypeError, UnicodeEncodeError):
        raise invalid from None
    if not isinstance(decoded, dict) or not all(
        isinstance(value, dict) and len(value) == 1 and isinstance(value.get("S"), str)
        for value in decoded.values()
    ):
        raise invalid
    if shape is not None:
        names, partition_name = shape
        if set(decoded) != names or (partition is not None and decoded[partition_name]["S"] != partition):
            raise invalid
    return decoded
