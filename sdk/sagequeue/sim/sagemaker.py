"""The modelled SageMaker: attempts that start cold or warm, train, upload, stop with a grace period, leave
warm pools for their keep-alive, and meet capacity errors.

Only what the queue's decisions depend on is modelled, with the same rules as the emulator
(docs/emulator.md): a create reuses the oldest Available warm pool whose resource key matches, whoever
asked for it; a create beyond the account limit (instances of live attempts plus Available warm pools) is
ResourceLimitExceeded and creates nothing; a stop lands after `stop_grace_seconds`; a job stopped or ended
after its instances launched leaves a warm pool when it had a keep-alive.
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from sagequeue_core.domain import ResourceKey


@dataclass(frozen=True)
class Timings:
    """How long SageMaker takes, in seconds. The defaults are typical for trn1 in practice."""

    cold_start_seconds: float = 300.0  # Starting on a cold start: launching instances
    warm_start_seconds: float = 20.0  # Starting on a reused warm pool
    download_seconds: float = 60.0  # Downloading (image and data) before Training
    upload_seconds: float = 30.0  # Uploading after Training
    stop_grace_seconds: float = 120.0  # StopTrainingJob: SIGTERM, up to 120 s, then Stopped
    #: share of cold starts that never get instances: Starting, then Failed with CapacityError
    capacity_error_rate: float = 0.0
    capacity_error_after_seconds: float = 1800.0

    @property
    def provisioning_seconds(self) -> float:
        """Creation to Training on a cold start."""
        return self.cold_start_seconds + self.download_seconds


class Phase(StrEnum):
    STARTING = "Starting"
    DOWNLOADING = "Downloading"
    TRAINING = "Training"
    UPLOADING = "Uploading"
    STOPPING = "Stopping"
    ENDED = "Ended"


#: what the pool occupancy chart calls each phase
OCCUPANCY = {
    Phase.STARTING: "starting",
    Phase.DOWNLOADING: "starting",
    Phase.TRAINING: "training",
    Phase.UPLOADING: "training",
    Phase.STOPPING: "stopping",
}


class Outcome(StrEnum):
    COMPLETED = "Completed"
    STOPPED = "Stopped"
    CAPACITY_ERROR = "CapacityError"


class ResourceLimitExceeded(Exception):
    """The create would exceed the account's limit for the instance type; nothing was created."""


@dataclass(eq=False)
class Attempt:
    """One training job on SageMaker."""

    name: str
    job_name: str
    pool: str
    instances: int
    key: ResourceKey | None
    keep_alive_seconds: int
    created: float
    remaining_work: float  # training seconds to do in this attempt
    checkpoint_seconds: float | None  # training seconds between checkpoints; None: it writes none
    #: how far each interval may differ from the one before (a share): the interval drifts, within half
    #: and twice `checkpoint_seconds`; 0: every interval is `checkpoint_seconds`
    checkpoint_drift: float = 0.0
    reused: str | None = None  # the training job whose warm pool it reuses
    capacity_error: bool = False
    phase: Phase = Phase.STARTING
    phase_since: float = 0.0
    launched: bool = False  # instances are the job's (past Starting): a stop leaves a warm pool
    training_since: float | None = None  # start of this attempt's Training phase
    first_training_at: float | None = None
    trained: float = 0.0  # training seconds done by this attempt
    outcome: Outcome | None = None
    ended: float | None = None
    stop_requested: bool = False
    token: int = 0  # bumps on every re-schedule, so a superseded timed step is ignored
    #: the attempt's checkpoints so far, as training seconds into the attempt (drawn as training goes on)
    marks: list[float] = field(default_factory=list)

    def saved_work(self) -> float:
        """Training seconds kept by checkpoints if the attempt ends now: all of it once completed, else the
        training up to its last checkpoint."""
        if self.outcome is Outcome.COMPLETED:
            return self.trained
        return self.last_mark(self.trained) or 0.0

    def trained_by(self, now: float) -> float:
        """Training seconds done by `now` (counting the Training phase still under way)."""
        if self.training_since is None:
            return self.trained
        return self.trained + max(now - self.training_since, 0.0)

    def last_mark(self, trained: float) -> float | None:
        """The last checkpoint written by `trained` training seconds into the attempt; None: none yet."""
        self._draw_marks(trained)
        done = bisect.bisect_right(self.marks, trained)
        return self.marks[done - 1] if done else None

    def checkpoints(self, now: float) -> tuple[float | None, float | None]:
        """What the attempt has reported by `now` (docs/adr/0023): when it wrote its last checkpoint (a
        simulated time) and the interval between its last two; None where it has not written that many."""
        if self.first_training_at is None:
            return None, None
        trained = self.trained_by(now)
        self._draw_marks(trained)
        done = bisect.bisect_right(self.marks, trained)
        if not done:
            return None, None
        # one Training phase per attempt: its training seconds map onto time from its first Training
        last = self.first_training_at + self.marks[done - 1]
        interval = self.marks[done - 1] - self.marks[done - 2] if done > 1 else None
        return last, interval

    def _draw_marks(self, trained: float) -> None:
        if not self.checkpoint_seconds:
            return
        base = self.checkpoint_seconds
        while not self.marks or self.marks[-1] <= trained:
            if not self.marks or not self.checkpoint_drift:
                gap = base
            else:
                previous = self.marks[-1] - (self.marks[-2] if len(self.marks) > 1 else 0.0)
                # the same attempt draws the same way under every policy
                draw = zlib.crc32(f"{self.name}:{len(self.marks)}".encode()) / 0xFFFFFFFF
                gap = min(max(previous * (1 + self.checkpoint_drift * (2 * draw - 1)), base / 2), 2 * base)
            self.marks.append((self.marks[-1] if self.marks else 0.0) + gap)


@dataclass(eq=False)
class RetainedPool:
    """An Available warm pool: the instances of an ended attempt, kept for its keep-alive."""

    training_job_name: str
    job_name: str
    resource_key: ResourceKey
    since: float
    expires: float
    token: int = 0

    @property
    def pool(self) -> str:
        return self.resource_key.instance_type

    @property
    def instances(self) -> int:
        return self.resource_key.instance_count


class ModelledSageMaker:
    """Attempts and warm pools on a clock the engine drives.

    `schedule(at, step)` asks the engine to call `step()` at simulated time `at`; `on_end(attempt)` is told
    of every attempt that ended (the state-change event the scheduler acts on); `on_change(pool)` of every
    change in a pool's occupancy (for the metrics).
    """

    def __init__(
        self,
        timings: Timings,
        limits: Mapping[str, int],
        *,
        schedule: Callable[[float, Callable[[], None]], None],
        on_end: Callable[[Attempt], None],
        on_change: Callable[[str, float], None],
        on_training: Callable[[Attempt], None] | None = None,
        on_launched: Callable[[Attempt], None] | None = None,
        seed: int = 0,
    ) -> None:
        self.timings = timings
        self.limits = dict(limits)
        self._schedule = schedule
        self._on_end = on_end
        self._on_change = on_change
        self._on_training = on_training
        self._on_launched = on_launched
        self._seed = seed
        self.attempts: dict[str, Attempt] = {}
        self.live: dict[str, Attempt] = {}
        self.warm: dict[str, RetainedPool] = {}  # Available pools by training job name, oldest first
        self.held: dict[str, int] = dict.fromkeys(self.limits, 0)  # live + Available instances per pool
        self.now = 0.0
        #: bumps whenever what a scheduler can see changes: an attempt created, training, stopping or
        #: ended, a warm pool kept or gone (not Downloading nor Uploading: no scheduler reads those)
        self.version = 0

    # --- the API the scheduler calls ------------------------------------------------------------------------

    def create(
        self,
        *,
        name: str,
        job_name: str,
        pool: str,
        instances: int,
        key: ResourceKey | None,
        keep_alive_seconds: int,
        remaining_work: float,
        checkpoint_seconds: float | None,
        checkpoint_drift: float = 0.0,
    ) -> Attempt:
        warm = self._matching(key)
        if warm is None and self.held.get(pool, 0) + instances > self.limits.get(pool, 0):
            raise ResourceLimitExceeded(
                f"{pool}: limit {self.limits.get(pool, 0)}, in use {self.held.get(pool, 0)}, asked {instances}"
            )
        attempt = Attempt(
            name=name,
            job_name=job_name,
            pool=pool,
            instances=instances,
            key=key,
            keep_alive_seconds=keep_alive_seconds,
            created=self.now,
            remaining_work=remaining_work,
            checkpoint_seconds=checkpoint_seconds,
            checkpoint_drift=checkpoint_drift,
            phase_since=self.now,
        )
        self.attempts[name] = attempt
        self.version += 1
        self.live[name] = attempt
        if warm is not None:
            self._drop_warm(warm)  # its instances stay held: they become the attempt's
            attempt.reused = warm.training_job_name
            self.held[pool] = self.held.get(pool, 0) - warm.instances
            self._step_after(attempt, self.timings.warm_start_seconds, self._launched)
        else:
            attempt.capacity_error = self._capacity_error(name)
            if attempt.capacity_error:
                self._step_after(attempt, self.timings.capacity_error_after_seconds, self._failed_capacity)
            else:
                self._step_after(attempt, self.timings.cold_start_seconds, self._launched)
        self.held[pool] = self.held.get(pool, 0) + instances
        self._on_change(pool, self.now)
        return attempt

    def stop(self, name: str) -> bool:
        """StopTrainingJob; False when the attempt already ended or is stopping (a ValidationException)."""
        attempt = self.live.get(name)
        if attempt is None or attempt.phase is Phase.STOPPING:
            return False
        self._leave_phase(attempt)
        attempt.stop_requested = True
        self.version += 1
        attempt.phase = Phase.STOPPING
        attempt.phase_since = self.now
        self._step_after(attempt, self.timings.stop_grace_seconds, self._stopped)
        self._on_change(attempt.pool, self.now)
        return True

    def release(self, name: str) -> bool:
        """UpdateTrainingJob(KeepAlivePeriodInSeconds=0) on an Available pool; False if it is not one."""
        warm = self.warm.get(name)
        if warm is None:
            return False
        self._terminate(warm)
        return True

    def in_use(self, pool: str) -> int:
        return self.held.get(pool, 0)

    # --- timed steps ----------------------------------------------------------------------------------------

    def _step_after(self, attempt: Attempt, seconds: float, step: Callable[[Attempt], None]) -> None:
        attempt.token += 1
        token = attempt.token

        def run() -> None:
            if attempt.token == token:
                step(attempt)

        self._schedule(self.now + seconds, run)

    def _launched(self, attempt: Attempt) -> None:
        attempt.launched = True
        attempt.phase = Phase.DOWNLOADING
        attempt.phase_since = self.now
        self.version += 1
        if self._on_launched is not None:
            self._on_launched(attempt)
        self._on_change(attempt.pool, self.now)
        self._step_after(attempt, self.timings.download_seconds, self._train)

    def _train(self, attempt: Attempt) -> None:
        attempt.phase = Phase.TRAINING
        attempt.phase_since = self.now
        attempt.training_since = self.now
        self.version += 1
        if attempt.first_training_at is None:
            attempt.first_training_at = self.now
        if self._on_training is not None:
            self._on_training(attempt)
        self._on_change(attempt.pool, self.now)
        self._step_after(attempt, attempt.remaining_work, self._upload)

    def _upload(self, attempt: Attempt) -> None:
        self._leave_phase(attempt)
        attempt.phase = Phase.UPLOADING
        attempt.phase_since = self.now
        self._on_change(attempt.pool, self.now)
        self._step_after(attempt, self.timings.upload_seconds, self._completed)

    def _completed(self, attempt: Attempt) -> None:
        self._end(attempt, Outcome.COMPLETED)

    def _stopped(self, attempt: Attempt) -> None:
        self._end(attempt, Outcome.STOPPED)

    def _failed_capacity(self, attempt: Attempt) -> None:
        self._end(attempt, Outcome.CAPACITY_ERROR)

    def _leave_phase(self, attempt: Attempt) -> None:
        if attempt.phase is Phase.TRAINING and attempt.training_since is not None:
            attempt.trained += self.now - attempt.training_since
            attempt.training_since = None

    def _end(self, attempt: Attempt, outcome: Outcome) -> None:
        attempt.phase = Phase.ENDED
        self.version += 1
        attempt.outcome = outcome
        attempt.ended = self.now
        del self.live[attempt.name]
        self.held[attempt.pool] -= attempt.instances
        if attempt.launched and attempt.keep_alive_seconds > 0 and attempt.key is not None:
            warm = RetainedPool(
                attempt.name,
                attempt.job_name,
                attempt.key,
                since=self.now,
                expires=self.now + attempt.keep_alive_seconds,
            )
            self.warm[attempt.name] = warm
            self.held[attempt.pool] += warm.instances
            self._schedule(warm.expires, lambda: self._expire(warm))
        self._on_change(attempt.pool, self.now)
        self._on_end(attempt)

    def _expire(self, warm: RetainedPool) -> None:
        if self.warm.get(warm.training_job_name) is warm:
            self._terminate(warm)

    def _terminate(self, warm: RetainedPool) -> None:
        self.version += 1
        self._drop_warm(warm)
        self.held[warm.pool] -= warm.instances
        self._on_change(warm.pool, self.now)

    def _drop_warm(self, warm: RetainedPool) -> None:
        del self.warm[warm.training_job_name]

    def _matching(self, key: ResourceKey | None) -> RetainedPool | None:
        if key is None:
            return None
        return next((w for w in self.warm.values() if w.resource_key == key), None)

    def _capacity_error(self, name: str) -> bool:
        rate = self.timings.capacity_error_rate
        if rate <= 0:
            return False
        # the same attempt draws the same way under every policy, so policies meet the same bad luck
        draw = zlib.crc32(f"{self._seed}:{name}".encode()) / 0xFFFFFFFF
        return draw < rate


__all__ = [
    "OCCUPANCY",
    "Attempt",
    "ModelledSageMaker",
    "Outcome",
    "Phase",
    "ResourceLimitExceeded",
    "RetainedPool",
    "Timings",
]
