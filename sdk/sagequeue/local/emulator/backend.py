"""The emulated SageMaker account: every training job, the instance limits, warm-pool matching, and the
operations the HTTP layer dispatches to. All state lives under one lock.

Operations and timed steps return `Outputs` (events and metric data) instead of delivering them: the
caller sends them after releasing the lock, because a subscriber may call the emulator back.
"""

from __future__ import annotations

import base64
import binascii
import copy
import heapq
import itertools
import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sagequeue.local.clock import Clock
from sagequeue.local.emulator import model_rules
from sagequeue.local.emulator import validation as check
from sagequeue.local.emulator.errors import (
    ResourceInUse,
    ResourceLimitExceeded,
    ValidationError,
    not_found,
)
from sagequeue.local.emulator.events import state_change_event
from sagequeue.local.emulator.metrics import namespace_of, utilization_data
from sagequeue.local.emulator.model import TrainingJob, WarmPoolState
from sagequeue.local.emulator.simulation import SimPlan, Timings
from sagequeue_core.checkpoint_marker import CheckpointReport

LIST_DEFAULT_MAX_RESULTS = 10
LIST_MAX_RESULTS = 100
TAGS_DEFAULT_MAX_RESULTS = 50


@dataclass
class Outputs:
    """What one operation or one processing pass produced, in the order it happened."""

    events: list[dict[str, Any]] = field(default_factory=list)
    metric_data: list[dict[str, Any]] = field(default_factory=list)
    #: When each event's change happened (parallel to `events`; an event's `time` is only to the second).
    event_times: list[datetime] = field(default_factory=list)
    #: Checkpoint markers jobs wrote, with the CheckpointConfig.S3Uri SageMaker syncs each to.
    checkpoints: list[tuple[str, CheckpointReport]] = field(default_factory=list)

    def extend(self, other: Outputs) -> None:
        self.events.extend(other.events)
        self.metric_data.extend(other.metric_data)
        self.event_times.extend(other.event_times)
        self.checkpoints.extend(other.checkpoints)

    def __bool__(self) -> bool:
        return bool(self.events or self.metric_data or self.checkpoints)


class SageMakerBackend:
    """One region of one account. Thread-safe: every public method takes the lock."""

    def __init__(
        self,
        clock: Clock,
        timings: Timings,
        instance_limits: Mapping[str, int] | None,
        region: str,
        account_id: str,
        not_found_code: str = "ValidationException",
    ) -> None:
        if not_found_code not in ("ResourceNotFound", "ValidationException"):
            raise ValueError(
                f"not_found_code must be ResourceNotFound or ValidationException, got {not_found_code!r}"
            )
        self.not_found_code = not_found_code
        self.clock = clock
        self.timings = timings
        self.instance_limits = dict(instance_limits or {})
        for instance_type, limit in self.instance_limits.items():
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
                raise ValueError(
                    f"instance limit of {instance_type} must be a non-negative integer, got {limit!r}"
                )
        self.region = region
        self.account_id = account_id
        #: Instances the region can launch per type (EC2 capacity, not the account quota); types not listed
        #: are unlimited. Settable at any time with `set_capacity`.
        self.capacity: dict[str, int] = {}
        self._waiting: list[str] = []  # jobs retrying in Starting for capacity, first come first served
        #: The warm-pool quota per instance type ("<type> for training warm pool usage"); AWS's default is
        #: 0. Types not listed have `default_warm_pool_limit` (None: unlimited). A pool beyond it is not
        #: retained when its job ends.
        self.warm_pool_limits: dict[str, int] = {}
        self.default_warm_pool_limit: int | None = None
        self.lock = threading.RLock()
        #: Send every state-change event twice, as SageMaker sometimes does, to exercise idempotent consumers.
        self.duplicate_events = False
        #: Makes each event's id; the emulator sets a seeded one so that runs repeat byte for byte.
        self.new_event_id: Callable[[], str] | None = None
        #: Whether utilization data is built at all; without a CloudWatch to publish to it is skipped.
        self.metrics_enabled = True
        self._jobs: dict[str, TrainingJob] = {}
        self._order: dict[str, int] = {}  # creation sequence, the tie-breaker of every ordering
        self._sequence: list[TrainingJob] = []  # every job in creation order, deleted ones included
        self._due: list[tuple[datetime, int, str]] = []  # heap; stale entries are skipped when popped
        self._heap_seq = itertools.count()
        self._holders: set[str] = set()  # jobs holding instances: live, or with an Available warm pool
        self._available: set[str] = set()  # ended jobs whose warm pool is Available
        # Heap of the next utilization mark of each training job; stale entries are skipped like in _due.
        self._metric_due: list[tuple[datetime, int, str]] = []
        self._operations: dict[str, Callable[[Mapping[str, Any], datetime, Outputs], dict[str, Any]]] = {
            "CreateTrainingJob": self._create_training_job,
            "DescribeTrainingJob": self._describe_training_job,
            "ListTrainingJobs": self._list_training_jobs,
            "StopTrainingJob": self._stop_training_job,
            "UpdateTrainingJob": self._update_training_job,
            "DeleteTrainingJob": self._delete_training_job,
            "AddTags": self._add_tags,
            "ListTags": self._list_tags,
            "DeleteTags": self._delete_tags,
        }

    @property
    def operations(self) -> frozenset[str]:
        return frozenset(self._operations)

    # --- entry points ----------------------------------------------------------------------------------

    def call(self, operation: str, request: Mapping[str, Any], outputs: Outputs) -> dict[str, Any]:
        """Runs one API operation at the clock's current time, after every step that fell due before it.

        What happens is appended to `outputs`, also when the operation itself is refused: the steps that
        fell due before it still happened and their events must still go out.
        """
        handler = self._operations[operation]
        with self.lock:
            now = self.clock.now()
            outputs.extend(self._process_due_locked(now))
            check.require_mapping(request, operation)
            model_rules.check(operation, request)
            try:
                return handler(request, now, outputs)
            finally:
                self._grant_waiting(now, outputs)

    def next_due(self) -> datetime | None:
        with self.lock:
            while self._due:
                due, _, name = self._due[0]
                owner = self._jobs.get(name)
                if owner is not None and owner.due() == due:
                    return due
                heapq.heappop(self._due)
            return None

    def process_due(self, upto: datetime) -> Outputs:
        with self.lock:
            return self._process_due_locked(upto)

    def job_names(self) -> list[str]:
        with self.lock:
            return list(self._jobs)

    def describe(self, name: str) -> dict[str, Any]:
        """DescribeTrainingJob without HTTP (datetimes as datetimes), for the embedded stack's tools."""
        with self.lock:
            job = self._job(name)
            return job.describe(self.clock.now())

    def instances_in_use(self) -> dict[str, int]:
        """Instances held per type: live jobs plus Available warm pools (what the limit counts)."""
        with self.lock:
            return self._instances_held()

    # --- time ------------------------------------------------------------------------------------------

    def _process_due_locked(self, upto: datetime) -> Outputs:
        outputs = Outputs()
        while self._due:
            due, _, name = self._due[0]
            if due > upto:
                break
            heapq.heappop(self._due)
            owner = self._jobs.get(name)
            if owner is None or owner.due() != due:
                continue  # superseded by a later change to this job, or deleted
            job = owner
            job.collect_metrics(due)
            self._drain_metrics(job, outputs)
            if job.fire(due):
                self._apply_warm_pool_quota(job, due)
                self._emit(job, due, outputs)
            self._reschedule(job)
            self._grant_waiting(due, outputs)
        while self._metric_due and self._metric_due[0][0] <= upto:
            mark, _, name = heapq.heappop(self._metric_due)
            metered = self._jobs.get(name)
            if metered is None or metered.metric_next != mark:
                continue
            job = metered
            job.collect_metrics(upto)
            self._drain_metrics(job, outputs)
            self._schedule_metrics(job)
        return outputs

    def _apply_warm_pool_quota(self, job: TrainingJob, at: datetime) -> None:
        pool = job.warm_pool
        if not job.ended or pool is None or pool.status is not WarmPoolState.AVAILABLE:
            return
        if pool.available_since != at or (not self.warm_pool_limits and self.default_warm_pool_limit is None):
            return
        retained: dict[str, int] = {}
        for name in self._available:
            if name != job.name:
                for instance_type, count in self._jobs[name].demand.items():
                    retained[instance_type] = retained.get(instance_type, 0) + count
        for instance_type, count in job.demand.items():
            limit = self.warm_pool_limits.get(instance_type, self.default_warm_pool_limit)
            if limit is not None and retained.get(instance_type, 0) + count > limit:
                pool.end(at, WarmPoolState.TERMINATED)
                return

    def end_warm_pool(self, name: str, at: datetime) -> None:
        job = self._job(name)
        pool = job.warm_pool
        if pool is None or pool.status is not WarmPoolState.AVAILABLE:
            raise ValueError(f"training job {name} has no Available warm pool to end")
        pool.end(at, WarmPoolState.TERMINATED)
        job.last_modified = at
        self._reschedule(job)
        self._grant_waiting(at, Outputs())

    def add_training_plan(self, arn: str, instance_count: int) -> Outputs:
        """A training plan whose `instance_count` reserved instances its jobs share; beyond them a job waits
        in Pending."""
        with self.lock:
            if isinstance(instance_count, bool) or not isinstance(instance_count, int) or instance_count < 0:
                raise ValueError(
                    f"a training plan's instance count must be a non-negative integer, got {instance_count!r}"
                )
            self.capacity[_plan_key(arn)] = instance_count
            outputs = Outputs()
            self._grant_waiting(self.clock.now(), outputs)
            return outputs

    def departures_from_aws(self) -> set[str]:
        """What the jobs created so far met that AWS would not have given them: an instance type without a
        regional capacity, a plan never registered, a warm pool retained without a quota."""
        with self.lock:
            found: set[str] = set()
            for job in self._sequence:
                plan = job.request.get("ResourceConfig", {}).get("TrainingPlanArn")
                if plan and _plan_key(plan) not in self.capacity:
                    found.add("training_plans")
                elif any(t not in self.capacity for t in job.demand):
                    found.add("region_capacity")
                if (
                    job.warm_pool is not None
                    and job.launched
                    and job.keep_alive > 0
                    and self.default_warm_pool_limit is None
                    and any(t not in self.warm_pool_limits for t in job.demand)
                ):
                    found.add("warm_pool_quota")
            return found

    def _capacity_demand(self, job: TrainingJob) -> dict[str, int]:
        """What a job takes from: its training plan's reserved instances, or the region's."""
        plan = job.request.get("ResourceConfig", {}).get("TrainingPlanArn")
        if plan and _plan_key(plan) in self.capacity:
            return {_plan_key(plan): job.instance_count}
        return job.demand

    def set_capacity(self, capacity: Mapping[str, int | None]) -> None:
        """Sets how many instances of each type the region can launch (None: unlimited again). Jobs retrying
        for capacity launch as soon as it is there."""
        with self.lock:
            for instance_type, count in capacity.items():
                if count is None:
                    self.capacity.pop(instance_type, None)
                    continue
                if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                    raise ValueError(
                        f"capacity of {instance_type} must be a non-negative integer, got {count!r}"
                    )
                self.capacity[instance_type] = count
            self._grant_waiting(self.clock.now(), Outputs())

    def _capacity_used(self) -> dict[str, int]:
        """Instances launched or launching in the region: every holder but the jobs still retrying."""
        used: dict[str, int] = {}
        for name in self._holders:
            job = self._jobs[name]
            if job.waiting_for_capacity or not job.held_instances():
                continue
            for key, count in self._capacity_demand(job).items():
                used[key] = used.get(key, 0) + count
        return used

    def _has_capacity(self, demand: Mapping[str, int], used: Mapping[str, int]) -> bool:
        return all(used.get(t, 0) + n <= self.capacity[t] for t, n in demand.items() if t in self.capacity)

    def _grant_waiting(self, at: datetime, outputs: Outputs) -> None:
        """Launches the retrying jobs the region now has capacity for, oldest first."""
        if not self._waiting:
            return
        still: list[str] = []
        used = self._capacity_used()
        for name in self._waiting:
            job = self._jobs[name]
            if not job.waiting_for_capacity:
                continue  # stopped, or failed with CapacityError
            demand = self._capacity_demand(job)
            if self._has_capacity(demand, used):
                if job.grant_capacity(at):
                    self._emit(job, at, outputs)
                for key, count in demand.items():
                    used[key] = used.get(key, 0) + count
                self._reschedule(job)
            else:
                still.append(name)
        self._waiting = still

    def _reschedule(self, job: TrainingJob) -> None:
        due = job.due()
        if due is not None:
            heapq.heappush(self._due, (due, next(self._heap_seq), job.name))
        if job.held_instances():
            self._holders.add(job.name)
        else:
            self._holders.discard(job.name)
        if job.ended and job.name in self._holders:
            self._available.add(job.name)
        else:
            self._available.discard(job.name)
        self._schedule_metrics(job)

    def _schedule_metrics(self, job: TrainingJob) -> None:
        if job.metric_next is not None and self.metrics_enabled:
            heapq.heappush(self._metric_due, (job.metric_next, next(self._heap_seq), job.name))

    def _emit(self, job: TrainingJob, at: datetime, outputs: Outputs) -> None:
        description = job.describe(at, for_event=True)
        for _ in range(2 if self.duplicate_events else 1):
            # SageMaker may send several events for one change: same detail, each with its own id.
            event_id = self.new_event_id() if self.new_event_id is not None else None
            outputs.events.append(
                state_change_event(
                    description,
                    job.tags,
                    at,
                    region=self.region,
                    account_id=self.account_id,
                    event_id=event_id,
                )
            )
            outputs.event_times.append(at)

    def _drain_metrics(self, job: TrainingJob, outputs: Outputs) -> None:
        if job.pending_checkpoints:
            uri = (job.request.get("CheckpointConfig") or {}).get("S3Uri")
            if uri:  # without a CheckpointConfig SageMaker syncs nothing: the markers stay on the instance
                outputs.checkpoints.extend((uri, report) for report in job.pending_checkpoints)
            job.pending_checkpoints.clear()
        if not job.pending_metrics:
            return
        if self.metrics_enabled:
            # A cold neuronx-cc compile keeps the NeuronCores idle for the first minutes of Training.
            until = job.compile_until
            compiling = [m for m in job.pending_metrics if until is not None and m <= until]
            busy = [m for m in job.pending_metrics if until is None or m > until]
            namespace = namespace_of(job.request.get("Environment"))
            outputs.metric_data.extend(
                utilization_data(job.name, job.instance_count, compiling, 0.0, namespace)
            )
            outputs.metric_data.extend(
                utilization_data(job.name, job.instance_count, busy, job.plan.reported_utilization, namespace)
            )
        job.pending_metrics.clear()

    # --- operations ------------------------------------------------------------------------------------

    def _job(self, name: str) -> TrainingJob:
        job = self._jobs.get(name)
        if job is None:
            raise not_found(name, self.not_found_code)
        return job

    def _arn(self, name: str) -> str:
        return f"arn:aws:sagemaker:{self.region}:{self.account_id}:training-job/{name}"

    def _instances_held(self) -> dict[str, int]:
        held: dict[str, int] = {}
        for name in self._holders:
            for instance_type, count in self._jobs[name].held_instances().items():
                held[instance_type] = held.get(instance_type, 0) + count
        return held

    def _create_training_job(
        self, request: Mapping[str, Any], now: datetime, outputs: Outputs
    ) -> dict[str, Any]:
        check.create_training_job(request)
        name = request["TrainingJobName"]
        if name in self._jobs:
            raise ResourceInUse(
                "Training job names must be unique within an AWS account and region, and a training job with "
                f"this name already exists ({self._arn(name)})"
            )
        plan = SimPlan.from_environment(request.get("Environment"), self.timings)
        stored = copy.deepcopy(dict(request))
        tags = {
            t["Key"]: t["Value"] for t in check.tag_list(stored.pop("Tags", None), "tags", required=False)
        }
        job = TrainingJob(
            name=name,
            arn=self._arn(name),
            request=stored,
            created_at=now,
            plan=plan,
            timings=self.timings,
            tags=tags,
        )
        donor = self._matching_warm_pool(job, now)
        if donor is None:
            self._check_limits(job.demand)
            # Only jobs already retrying go first: a new job waits behind them for the same capacity.
            demand = self._capacity_demand(job)
            waiting_ahead = any(
                self._jobs[n].waiting_for_capacity and set(self._capacity_demand(self._jobs[n])) & set(demand)
                for n in self._waiting
            )
            has_capacity = not waiting_ahead and self._has_capacity(demand, self._capacity_used())
            on_plan = any(key.startswith(PLAN_PREFIX) for key in demand)
            job.start(now, has_capacity=has_capacity, on_plan=on_plan)
            if job.waiting_for_capacity:
                self._waiting.append(name)
        else:
            pool = donor.hand_over_pool(now, to_job=name)
            job.start(now, reused_pool=pool, reused_from=donor.name)
            self._reschedule(donor)
        self._jobs[name] = job
        self._order[name] = len(self._sequence)
        self._sequence.append(job)
        self._reschedule(job)
        self._emit(job, now, outputs)
        return {"TrainingJobArn": job.arn}

    def _matching_warm_pool(self, job: TrainingJob, now: datetime) -> TrainingJob | None:
        """The Available warm pool a new job may take: identical ResourceKey, still within its limits.

        The oldest pool goes first, so the one closest to expiry is used rather than wasted.
        """
        key = job.resource_key
        if key is None:
            return None
        candidates = [
            other
            for other in (self._jobs[name] for name in self._available)
            if other.pool_is_reusable(now) and other.resource_key == key
        ]
        if not candidates:
            return None
        return min(candidates, key=lambda o: (o.warm_pool.available_since, self._order[o.name]))  # type: ignore[union-attr]

    def _check_limits(self, demand: Mapping[str, int]) -> None:
        if not any(instance_type in self.instance_limits for instance_type in demand):
            return
        held = self._instances_held()
        for instance_type, count in demand.items():
            limit = self.instance_limits.get(instance_type)
            if limit is None:
                continue
            used = held.get(instance_type, 0)
            if used + count > limit:
                raise ResourceLimitExceeded(
                    f"The account-level service limit '{instance_type} for training job usage' is {limit} "
                    f"Instances, with current utilization of {used} Instances and a request delta of {count} "
                    "Instances. Please use AWS Service Quotas to request an increase for this quota. If AWS "
                    "Service Quotas is not available, contact AWS support to request an increase for this quota."
                )

    def _describe_training_job(
        self, request: Mapping[str, Any], now: datetime, outputs: Outputs
    ) -> dict[str, Any]:
        name = check.training_job_name(request.get("TrainingJobName"))
        return self._job(name).describe(now)

    def _stop_training_job(
        self, request: Mapping[str, Any], now: datetime, outputs: Outputs
    ) -> dict[str, Any]:
        name = check.training_job_name(request.get("TrainingJobName"))
        job = self._job(name)
        job.begin_stop(now)
        self._drain_metrics(job, outputs)
        self._reschedule(job)
        self._emit(job, now, outputs)
        return {}

    def _delete_training_job(
        self, request: Mapping[str, Any], now: datetime, outputs: Outputs
    ) -> dict[str, Any]:
        """Removes an ended job without an Available warm pool; its name may then be used again."""
        name = check.training_job_name(request.get("TrainingJobName"))
        job = self._job(name)
        if not job.ended:
            raise ValidationError(
                f"The request was rejected because the training job is in status {job.status}."
            )
        if job.warm_pool is not None and job.warm_pool.status is WarmPoolState.AVAILABLE:
            raise ValidationError(
                f"Training job {name} has an Available warm pool; terminate it first "
                "(UpdateTrainingJob with ResourceConfig.KeepAlivePeriodInSeconds 0)."
            )
        job.deleted = True
        del self._jobs[name]
        self._holders.discard(name)
        self._available.discard(name)
        return {}

    def _update_training_job(
        self, request: Mapping[str, Any], now: datetime, outputs: Outputs
    ) -> dict[str, Any]:
        name = check.training_job_name(request.get("TrainingJobName"))
        config = request.get("ResourceConfig")
        others = [
            k for k in ("ProfilerConfig", "ProfilerRuleConfigurations", "RemoteDebugConfig") if request.get(k)
        ]
        if config is None and not others:
            raise ValidationError(
                "UpdateTrainingJob needs at least one of ResourceConfig, ProfilerConfig, "
                "ProfilerRuleConfigurations or RemoteDebugConfig."
            )
        job = self._job(name)
        if others and job.ended:
            raise ValidationError(
                f"The request was rejected because the training job is in status {job.status}."
            )
        if config is not None:
            if not isinstance(config, Mapping):
                raise check.violation(config, "resourceConfig", "be an object")
            seconds = check.keep_alive_seconds(
                config.get("KeepAlivePeriodInSeconds"), "resourceConfig.keepAlivePeriodInSeconds"
            )
            job.update_keep_alive(now, seconds)
        for key in others:
            job.request[key] = copy.deepcopy(request[key])
        self._reschedule(job)
        return {"TrainingJobArn": job.arn}

    # --- listing ---------------------------------------------------------------------------------------

    def _sort_key(self, job: TrainingJob, sort_by: str) -> list[Any]:
        created = job.created_at.timestamp()
        if sort_by == "Name":
            return [job.name, self._order[job.name]]
        if sort_by == "Status":
            return [job.status, created, self._order[job.name]]
        return [created, self._order[job.name]]

    def _ordered(
        self, sort_by: str, descending: bool, cursor: list[Any] | None
    ) -> Iterator[tuple[list[Any], TrainingJob]]:
        """Jobs in list order, from just after `cursor`.

        Jobs are stored in creation order and the clock never goes back, so the default order needs no sort:
        the cursor's creation sequence number says where to resume.
        """
        if sort_by == "CreationTime":
            jobs = self._sequence
            if descending:
                stop = int(cursor[1]) if cursor is not None else len(jobs)
                indices: Iterable[int] = range(min(stop, len(jobs)) - 1, -1, -1)
            else:
                indices = range(int(cursor[1]) + 1 if cursor is not None else 0, len(jobs))
            for index in indices:
                if not jobs[index].deleted:
                    yield self._sort_key(jobs[index], sort_by), jobs[index]
            return
        keyed = sorted(
            ((self._sort_key(job, sort_by), job) for job in self._jobs.values()),
            key=lambda pair: pair[0],
            reverse=descending,
        )
        for key, job in keyed:
            if cursor is None or (key < cursor if descending else key > cursor):
                yield key, job

    def _list_training_jobs(
        self, request: Mapping[str, Any], now: datetime, outputs: Outputs
    ) -> dict[str, Any]:
        limit = check.max_results(
            request.get("MaxResults"), "maxResults", 1, LIST_MAX_RESULTS, LIST_DEFAULT_MAX_RESULTS
        )
        sort_by = check.enum(request.get("SortBy"), "sortBy", check.SORT_BY) or "CreationTime"
        descending = (
            check.enum(request.get("SortOrder"), "sortOrder", check.SORT_ORDER) or "Ascending"
        ) == "Descending"
        status = check.enum(
            request.get("StatusEquals"), "statusEquals", (*check.TRAINING_STATUSES, "Deleting")
        )
        warm_status = check.enum(
            request.get("WarmPoolStatusEquals"), "warmPoolStatusEquals", check.WARM_POOL_STATUSES
        )
        contains = check.name_contains(request.get("NameContains"))
        created_after = check.timestamp(request.get("CreationTimeAfter"), "creationTimeAfter")
        created_before = check.timestamp(request.get("CreationTimeBefore"), "creationTimeBefore")
        modified_after = check.timestamp(request.get("LastModifiedTimeAfter"), "lastModifiedTimeAfter")
        modified_before = check.timestamp(request.get("LastModifiedTimeBefore"), "lastModifiedTimeBefore")
        plan = request.get("TrainingPlanArnEquals")
        if plan is not None and not isinstance(plan, str):
            raise check.violation(plan, "trainingPlanArnEquals", "be a training plan ARN")
        cursor = _decode_token(request.get("NextToken"), sort_by, descending)

        def selected(job: TrainingJob) -> bool:
            modified = job.last_modified or job.created_at
            return (
                (contains is None or contains.lower() in job.name.lower())
                and (created_after is None or job.created_at > created_after)
                and (created_before is None or job.created_at < created_before)
                and (modified_after is None or modified > modified_after)
                and (modified_before is None or modified < modified_before)
                and (plan is None or job.request["ResourceConfig"].get("TrainingPlanArn") == plan)
            )

        page: list[tuple[list[Any], TrainingJob]] = []
        more = False
        for key, job in self._ordered(sort_by, descending, cursor):
            if not selected(job):
                continue
            if len(page) == limit:
                more = True
                break
            page.append((key, job))
        # SageMaker's quirk, kept on purpose: the page is cut first and the status filters run on the cut
        # page, so a page may hold fewer than MaxResults jobs (even none) while more matches follow.
        summaries = [
            job.summary(now)
            for _, job in page
            if (status is None or job.status == status)
            and (
                warm_status is None
                or (job.warm_pool is not None and job.warm_pool.status is WarmPoolState(warm_status))
            )
        ]
        answer: dict[str, Any] = {"TrainingJobSummaries": summaries}
        if more:
            answer["NextToken"] = _encode_token(page[-1][0], sort_by, descending)
        return answer

    # --- tags ------------------------------------------------------------------------------------------

    def _tagged_job(self, arn: Any) -> TrainingJob:
        name = check.training_job_arn_name(arn)
        job = self._jobs.get(name)
        if job is None or job.arn != arn:
            raise not_found(str(arn), self.not_found_code)
        return job

    def _add_tags(self, request: Mapping[str, Any], now: datetime, outputs: Outputs) -> dict[str, Any]:
        job = self._tagged_job(request.get("ResourceArn"))
        tags = check.tag_list(request.get("Tags"), "tags", required=True)
        merged = dict(job.tags)
        merged.update({t["Key"]: t["Value"] for t in tags})
        if len(merged) > check.MAX_TAGS:
            raise ResourceLimitExceeded(
                f"Training job {job.name} would have {len(merged)} tags; a resource can have at most {check.MAX_TAGS}."
            )
        job.tags = merged
        return {"Tags": [{"Key": k, "Value": v} for k, v in merged.items()]}

    def _list_tags(self, request: Mapping[str, Any], now: datetime, outputs: Outputs) -> dict[str, Any]:
        job = self._tagged_job(request.get("ResourceArn"))
        limit = check.max_results(
            request.get("MaxResults"), "maxResults", 50, 10_000, TAGS_DEFAULT_MAX_RESULTS
        )
        token = request.get("NextToken")
        start = 0
        if token:
            try:
                start = int(base64.urlsafe_b64decode(str(token).encode()).decode())
            except (ValueError, binascii.Error):
                raise ValidationError(f"Invalid pagination token: {token!r}") from None
        items = [{"Key": k, "Value": v} for k, v in job.tags.items()]
        answer: dict[str, Any] = {"Tags": items[start : start + limit]}
        if start + limit < len(items):
            answer["NextToken"] = base64.urlsafe_b64encode(str(start + limit).encode()).decode()
        return answer

    def _delete_tags(self, request: Mapping[str, Any], now: datetime, outputs: Outputs) -> dict[str, Any]:
        job = self._tagged_job(request.get("ResourceArn"))
        keys = request.get("TagKeys")
        if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
            raise check.violation(keys, "tagKeys", "be a non-empty list of tag keys")
        for key in keys:
            job.tags.pop(key, None)
        return {}


PLAN_PREFIX = "training-plan:"


def _plan_key(arn: str) -> str:
    return PLAN_PREFIX + arn


#: The types in a cursor of each ordering (see SageMakerBackend._sort_key).
_CURSOR_SHAPES: dict[str, tuple[type | tuple[type, ...], ...]] = {
    "CreationTime": ((int, float), int),
    "Name": (str, int),
    "Status": (str, (int, float), int),
}


def _encode_token(key: list[Any], sort_by: str, descending: bool) -> str:
    payload = json.dumps({"after": key, "by": sort_by, "desc": descending}, separators=(",", ":"))
    return base64.urlsafe_b64encode(payload.encode()).decode()


def _decode_token(token: Any, sort_by: str, descending: bool) -> list[Any] | None:
    if token is None or token == "":
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(str(token).encode()).decode())
        key = payload["after"]
        if payload["by"] != sort_by or payload["desc"] != descending or not isinstance(key, list):
            raise ValueError("token from another ordering")
        shape = _CURSOR_SHAPES[sort_by]
        if len(key) != len(shape) or not all(
            isinstance(part, kind) and not isinstance(part, bool)
            for part, kind in zip(key, shape, strict=True)
        ):
            raise ValueError("malformed cursor")
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise ValidationError(
            f"Invalid pagination token {token!r}: pass the NextToken of the previous ListTrainingJobs "
            "call made with the same SortBy and SortOrder."
        ) from None
    return key
