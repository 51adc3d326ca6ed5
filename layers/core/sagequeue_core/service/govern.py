"""Governance: every training job in the account, queued or not, is held to the rules.

On each SageMaker state change (and for every job in progress, on the reconcile timer) the pure
`governance.govern` decides, and this use case carries the actions out:

- stop a job that breaks the tag and policy rules, record why, announce it (PolicyViolation, SNS);
- create the job's idle alarms when it trains, delete them when it stops working or ends;
- resume a job started outside the queue after a transient failure, as a clone with the next attempt's
  name, or a random fallback name when someone else holds it (a queued job is the scheduler's: it goes
  back to the queue instead);
- move a managed spot job interrupted too often to on-demand instances.

Every step is safe to repeat: stops are idempotent, alarms are created only when missing, a clone's name
is deterministic or recorded before its create and its seal tells governance's own earlier create from a
stranger's job, and announcements go out once per job through the store's claim ledger.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sagequeue_core.alarms import CloudWatchAlarms, alarms_of
from sagequeue_core.defaults import IDLE_ALARM_PREFIX, JOB_TAG, SEAL_TAG
from sagequeue_core.domain import (
    ATTEMPT_NAME_CHOICES,
    ATTEMPT_SECRET_BYTES,
    FALLBACK_TOKEN_LENGTH,
    Job,
    JobState,
    StopReason,
    attempt_name,
    parse_time,
    tags_to_dict,
)
from sagequeue_core.errors import AttemptNameTaken, SageMakerError, StaleVersion, TrainingJobNotFound
from sagequeue_core.events import EventType, Publisher, parse_training_job_event
from sagequeue_core.governance import (
    AlarmSpec,
    DeleteAlarms,
    EnsureAlarms,
    GovernanceRules,
    Lineage,
    RecoveryRules,
    ReplaceSpot,
    Resume,
    StopForPolicy,
    alarm_definition_difference,
    alarm_prefix,
    alarm_team,
    claimed_root,
    clone_request,
    govern,
    lineage_of,
    owner_of,
)
from sagequeue_core.notify import Notifier, notifier_of
from sagequeue_core.observability import POLICY_STOPS, RESUMES, count, logger
from sagequeue_core.sagemaker import SageMakerAdapter
from sagequeue_core.service.exemptions import honoured_tags
from sagequeue_core.store import Repository

#: Claim kinds in the store's idempotency ledger (one claim per training job and kind).
POLICY_STOP_CLAIM = "governance-policy-stop"
RESUME_CLAIM = "governance-resume"
SPOT_CLAIM = "governance-spot-replace"
#: The random secret that seals the clones of one root (subject: the root's training job name). It lives in
#: the table only, so nobody outside can seal a training job as a clone of another's job.
LINEAGE_CLAIM = "governance-lineage"
#: A fallback name chosen for the clone of a training job, recorded before its create (subject:
#: `<training job>#<choice>`), so a repeated event retries that very name rather than drawing a new one.
CLONE_NAME_CLAIM = "governance-clone-name"


def rules_from(settings: Any) -> GovernanceRules:
    """The governance rules of `sagequeue_core.config.Settings`; ConfigError when CloudWatch would refuse
    the idle alarms they describe."""
    idle = settings.idle_rules
    return GovernanceRules(
        policy=settings.policy_rules,
        idle=idle,
        recovery=RecoveryRules(
            resume_after_failure_min_runtime_seconds=settings.resume_after_failure_min_runtime_seconds,
            max_resumes=settings.max_resumes,
            max_spot_interruptions=settings.max_spot_interruptions,
        ),
    )


@dataclass
class Outcome:
    """What governance did about one training job, for logs and tests."""

    training_job_name: str
    stopped: str | None = None  # the reason, when governance stopped the job
    alarms_created: list[str] = field(default_factory=list)
    alarms_deleted: list[str] = field(default_factory=list)
    clone: str | None = None  # the next attempt governance created
    requeued: bool = False  # a queued job handed back to the queue


@dataclass
class ReconcileReport:
    jobs_seen: int = 0
    outcomes: list[Outcome] = field(default_factory=list)
    orphans_deleted: list[str] = field(default_factory=list)
    #: jobs SageMaker did not describe (5xx, throttling past the retries): governed at the next reconcile
    skipped: list[str] = field(default_factory=list)


class Governance:
    def __init__(
        self,
        *,
        sagemaker: SageMakerAdapter,
        alarms: CloudWatchAlarms,
        store: Repository,
        publisher: Publisher,
        notifier: Notifier,
        rules: GovernanceRules,
        alarm_topic_arn: str,
        clock: Callable[[], datetime],
        teams: frozenset[str] = frozenset(),
    ) -> None:
        self.teams = teams
        self.sagemaker = sagemaker
        self.alarms = alarms
        self.store = store
        self.publisher = publisher
        self.notifier = notifier
        self.rules = rules
        self.alarm_topic_arn = alarm_topic_arn
        self.clock = clock

    # --- entry points ---------------------------------------------------------------------------------------

    def on_event(self, event: Mapping[str, Any]) -> Outcome:
        """Handle one "SageMaker Training Job State Change" event (MalformedEvent if it names no job).

        The event is only a hint that the job changed: events arrive late, out of order, and anyone who can
        put events on a bus routed here can forge one. The job is judged by what SageMaker says now
        (DescribeTrainingJob, ListTags), never by the status or tags the event carries."""
        change = parse_training_job_event(event)
        name = change.training_job_name
        try:
            detail = self.sagemaker.describe(name)
        except TrainingJobNotFound:
            logger.warning("training job %s from an event does not exist", name)
            return Outcome(name)
        return self._govern(detail, self._tags(detail))

    def reconcile(self) -> ReconcileReport:
        """Govern every job in progress as if its last event had just arrived, then delete every idle alarm
        no training job wants (jobs that ended, lost events, exempt jobs)."""
        report = ReconcileReport()
        # Alarms are listed first: one created by an event while the jobs are being read is not in this
        # list, so it cannot be taken for an orphan.
        defined = self.alarms.definitions(IDLE_ALARM_PREFIX)
        existing = set(defined)
        wanted: set[str] = set()
        for summary in self.sagemaker.list_training_jobs(StatusEquals="InProgress"):
            name = summary["TrainingJobName"]
            try:
                detail = self.sagemaker.describe(name)
            except TrainingJobNotFound:
                continue
            except SageMakerError as exc:
                # One job SageMaker cannot describe now must not leave the others ungoverned; its alarms
                # are not orphans (the next reconcile, minutes later, governs it).
                logger.warning(
                    "describe failed; governed at the next reconcile", extra={"job": name, "error": str(exc)}
                )
                report.skipped.append(name)
                wanted.update(a for a in existing if a.startswith(alarm_prefix(name)))
                continue
            report.jobs_seen += 1
            outcome = self._govern(detail, self._tags(detail), existing=existing, defined=defined)
            report.outcomes.append(outcome)
            existing.difference_update(outcome.alarms_deleted)
            if outcome.stopped is None and detail.get("SecondaryStatus") == "Training":
                wanted.update(a for a in existing if a.startswith(alarm_prefix(name)))
                wanted.update(outcome.alarms_created)
        orphans = sorted(existing - wanted)
        if orphans:
            self.alarms.delete(orphans)
            report.orphans_deleted = orphans
            logger.info("deleted %d idle alarms whose jobs no longer train", len(orphans))
        return report

    # --- one job ----------------------------------------------------------------------------------------------

    def _govern(
        self,
        detail: Mapping[str, Any],
        tags: Mapping[str, str],
        *,
        existing: set[str] | None = None,
        defined: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> Outcome:
        name = str(detail["TrainingJobName"])
        outcome = Outcome(name)
        queued = self.store.find_job_by_training_job(name)
        if queued is not None and not queued.holds(name, tags):
            # The entry names this training job from its intent on, before its create: an unsealed job of
            # the name is someone else's (the create will be refused), and governed as theirs alone.
            queued = None
        # An attempt the scheduler started carries its queue entry's tag and seal even once it is no longer
        # the entry's current attempt: the queue owns its next attempt, and a clone would take that name.
        # The tag alone (anyone allowed AddTags sets it) does not make a training job the queue's.
        tagged = self.store.find_job(tags[JOB_TAG]) if queued is None and tags.get(JOB_TAG) else None
        of_queue = queued is not None or (tagged is not None and tagged.started(name, tags))
        lineage = self._lineage(name, tags)
        # The idle alarms of a queued job read its team's namespace: the team of the queue entry, never a tag.
        entry = queued if queued is not None else tagged if of_queue else None
        team = alarm_team(
            entry.team if entry is not None else None, detail, self.teams, self.store.team_quotas
        )
        actions = govern(
            detail, tags, self.rules, now=self.clock(), resumes_so_far=lineage.resumes, team=team
        )
        for action in actions:
            if isinstance(action, StopForPolicy):
                self._stop_for_policy(detail, tags, action, queued, outcome)
            elif isinstance(action, EnsureAlarms):
                have = existing if existing is not None else set(self.alarms.names(alarm_prefix(name)))
                for spec in action.specs:
                    # An alarm someone replaced under its name (PutMetricAlarm) is put back as governance
                    # makes it; the reconcile knows every alarm's definition, an event only their names.
                    replaced = (
                        defined is not None
                        and spec.name in defined
                        and self._replaced(defined[spec.name], spec)
                    )
                    if spec.name not in have or replaced:
                        self.alarms.put(spec, [self.alarm_topic_arn] if self.alarm_topic_arn else [])
                        outcome.alarms_created.append(spec.name)
            elif isinstance(action, DeleteAlarms):
                names = self.alarms.names(alarm_prefix(action.training_job_name))
                if names:
                    self.alarms.delete(names)
                outcome.alarms_deleted.extend(names)
            elif isinstance(action, Resume):
                if not of_queue:
                    self._clone(detail, tags, lineage, action.reason, outcome, resumed=True)
                # A queued job's failure is the scheduler's to handle: it requeues transient failures with
                # a backoff, bounded by max_attempts, so a clone here would run the job twice.
            elif isinstance(action, ReplaceSpot):
                if queued is not None:
                    self._requeue_without_spot(queued, action.reason, outcome)
                elif not of_queue:
                    self._replace_spot(detail, tags, lineage, action, outcome)
        if outcome.stopped or outcome.clone or outcome.alarms_created:
            logger.info(
                "governed %s: stopped=%s clone=%s alarms=%s",
                name,
                outcome.stopped,
                outcome.clone,
                outcome.alarms_created,
            )
        return outcome

    def _replaced(self, alarm: Mapping[str, Any], spec: AlarmSpec) -> bool:
        """Whether an alarm of our name is not the one governance made: another definition, or actions
        that no longer notify the alarm topic."""
        if alarm_definition_difference(alarm, spec) is not None:
            return True
        if alarm.get("ActionsEnabled") is False:
            return True
        return bool(self.alarm_topic_arn) and self.alarm_topic_arn not in (alarm.get("AlarmActions") or ())

    def _stop_for_policy(
        self,
        detail: Mapping[str, Any],
        tags: Mapping[str, str],
        action: StopForPolicy,
        queued: Job | None,
        outcome: Outcome,
    ) -> None:
        name = str(detail["TrainingJobName"])
        self.sagemaker.stop(name)
        if queued is not None:
            self._mark_stopping(queued, StopReason.POLICY, action.reason)
        outcome.stopped = action.reason
        owner = owner_of(detail, tags)
        rules = sorted({v.rule for v in action.violations})
        record = {
            "training_job_name": name,
            "owner": owner,
            "rules": rules,
            "violations": [v.message for v in action.violations],
            "reason": action.reason,
            "at": self.clock().isoformat(),
        }
        if not self.store.claim(POLICY_STOP_CLAIM, name, record):
            return  # a repeated event: stopped again (harmless), announced once
        count(POLICY_STOPS)
        self.publisher.publish(EventType.POLICY_VIOLATION, record)
        self.notifier.notify(
            f"sagequeue stopped {name}: policy violation",
            f"Training job {name} (owner {owner}) was stopped because it breaks the rule(s) "
            f"{', '.join(rules)}:\n\n"
            + "\n".join(f"- {v.message}" for v in action.violations)
            + "\n\nAn admin can exempt a job (submit it tagged "
            f"{self.rules.policy.exempt_tag}=true, or PUT /exemptions/<training job name>).",
            {"event": "PolicyViolation", "training_job_name": name, "owner": owner, "rule": ",".join(rules)},
        )

    def _replace_spot(
        self,
        detail: Mapping[str, Any],
        tags: Mapping[str, str],
        lineage: Lineage,
        action: ReplaceSpot,
        outcome: Outcome,
    ) -> None:
        name = str(detail["TrainingJobName"])
        self.sagemaker.stop(name)
        outcome.stopped = action.reason
        self._clone(detail, tags, lineage, action.reason, outcome, resumed=False, disable_spot=True)

    def _clone(
        self,
        detail: Mapping[str, Any],
        tags: Mapping[str, str],
        lineage: Lineage,
        reason: str,
        outcome: Outcome,
        *,
        resumed: bool,
        disable_spot: bool = False,
    ) -> None:
        """Create the job's next attempt, sealed under its root's secret. When a training job governance did
        not make holds the clone's name (anyone allowed CreateTrainingJob can create `<name>--2` ahead), the
        clone takes a fallback name with a random part, recorded before the create as the scheduler's
        attempts do; the stranger's job is never taken for the clone."""
        name = str(detail["TrainingJobName"])
        try:
            # The event's detail may lack fields CreateTrainingJob needs (inputs, VPC); the description has
            # them all.
            full = self.sagemaker.describe(name)
        except TrainingJobNotFound:
            logger.warning("cannot clone %s: it no longer exists", name)
            return
        secret = self._lineage_secret(lineage.root, create=True)
        held: list[str] = []
        for choice in range(ATTEMPT_NAME_CHOICES):
            request = clone_request(
                full,
                lineage=lineage,
                tags=tags,
                resumed=resumed,
                disable_spot=disable_spot,
                name=self._clone_name(name, lineage, choice),
                secret=secret,
            )
            clone = str(request["TrainingJobName"])
            try:
                self.sagemaker.create_attempt(request, job_name=lineage.root)
            except AttemptNameTaken:
                # ResourceInUse: either our own earlier create of this very clone (a repeated event), or a
                # stranger's job of that name, which we must not take for ours.
                if self._is_own_clone(request):
                    break
                held.append(clone)
                logger.warning(
                    "clone name held by a training job governance did not make; trying a fallback name",
                    extra={"job": name, "training_job_name": clone},
                )
                continue
            break
        else:
            raise AttemptNameTaken(
                f"every name tried for the clone of {name} is held by someone else: {', '.join(held)}",
                "ResourceInUse",
            )
        outcome.clone = clone
        kind = SPOT_CLAIM if disable_spot else RESUME_CLAIM
        record = {"training_job_name": name, "clone": clone, "reason": reason, "at": self.clock().isoformat()}
        if not self.store.claim(kind, name, record):
            return
        count(RESUMES)
        self.publisher.publish(EventType.JOB_RESUMED, {**record, "owner": owner_of(full, tags)})
        self.notifier.notify(
            f"sagequeue restarted {name} as {clone}",
            f"Training job {name} (owner {owner_of(full, tags)}): {reason}. It continues as {clone}"
            + (
                " on on-demand instances." if disable_spot else ", from its last checkpoint if it writes any."
            ),
            {"event": "JobResumed", "training_job_name": name, "clone": clone},
        )

    def _lineage(self, training_job_name: str, tags: Mapping[str, str]) -> Lineage:
        """Where the job stands in its chain of clones: its clone tags when its seal verifies under its
        root's secret, else an original (a job anyone tagged as another's clone is its own root)."""
        root = claimed_root(tags)
        secret = self._lineage_secret(root, create=False) if root else None
        return lineage_of(training_job_name, tags, secret)

    def _lineage_secret(self, root: str, *, create: bool) -> str | None:
        """The secret that seals the clones of `root`, made (once, by a conditional write) when `create`."""
        found = self.store.get_claim(LINEAGE_CLAIM, root)
        if found is None and create:
            self.store.claim(LINEAGE_CLAIM, root, {"secret": secrets.token_hex(ATTEMPT_SECRET_BYTES)})
            found = self.store.get_claim(LINEAGE_CLAIM, root)
        secret = (found or {}).get("secret")
        return str(secret) if secret else None

    def _clone_name(self, training_job_name: str, lineage: Lineage, choice: int) -> str:
        """The name the clone of `training_job_name` tries at its `choice`-th try: the lineage's next
        attempt name first, then fallback names whose random part is recorded before the create."""
        if choice == 0:
            return lineage.next_attempt_name
        token = secrets.token_hex(FALLBACK_TOKEN_LENGTH // 2)
        candidate = attempt_name(lineage.root, lineage.attempt + 1, token)
        subject = f"{training_job_name}#{choice}"
        if self.store.claim(CLONE_NAME_CLAIM, subject, {"clone": candidate}):
            return candidate
        recorded = (self.store.get_claim(CLONE_NAME_CLAIM, subject) or {}).get("clone")
        return str(recorded) if recorded else candidate

    def _is_own_clone(self, request: Mapping[str, Any]) -> bool:
        """Whether the training job of the request's name is governance's earlier create of this very
        clone: it carries the seal the request carries, which only the root's secret makes."""
        name = str(request["TrainingJobName"])
        seal = tags_to_dict(request.get("Tags")).get(SEAL_TAG)
        try:
            existing = self.sagemaker.describe(name)
        except TrainingJobNotFound:
            return False
        arn = existing.get("TrainingJobArn")
        found = self.sagemaker.tags(str(arn)).get(SEAL_TAG) if arn else None
        return seal is not None and found is not None and hmac.compare_digest(seal, found)

    def _requeue_without_spot(self, job: Job, reason: str, outcome: Outcome) -> None:
        """A queued spot job goes back to the queue on demand: it is preempted, so the scheduler stops it
        and starts its next attempt from the changed request when capacity allows."""
        for _ in range(3):
            if job.state not in (JobState.STARTING, JobState.RUNNING):
                return
            was = job.state
            job.request["EnableManagedSpotTraining"] = False
            stopping = job.request.get("StoppingCondition")
            if isinstance(stopping, dict):
                stopping.pop("MaxWaitTimeInSeconds", None)
            job.stop_reason = StopReason.PREEMPTED
            job.transition(JobState.PREEMPTING, self.clock(), reason)
            try:
                self.store.save_job(job, was=was)
            except StaleVersion:
                fresh = self.store.find_job(job.name)
                if fresh is None:
                    return
                job = fresh
                continue
            if job.training_job_name:
                self.sagemaker.stop(job.training_job_name)
            outcome.requeued = True
            outcome.stopped = reason
            return

    def _mark_stopping(self, job: Job, stop_reason: StopReason, reason: str) -> None:
        """Record on a queue entry why its attempt is being stopped; the scheduler moves it to the final
        state of `stop_reason` when SageMaker reports it Stopped."""
        for _ in range(3):
            if job.state not in (JobState.STARTING, JobState.RUNNING, JobState.PREEMPTING):
                return
            was = job.state
            job.stop_reason = stop_reason
            job.transition(JobState.STOPPING, self.clock(), reason)
            try:
                self.store.save_job(job, was=was)
                return
            except StaleVersion:
                fresh = self.store.find_job(job.name)
                if fresh is None:
                    return
                job = fresh

    def _tags(self, detail: Mapping[str, Any]) -> dict[str, str]:
        return honoured_tags(
            self.store,
            self.publisher,
            str(detail["TrainingJobName"]),
            self._sagemaker_tags(detail),
            self.rules.policy.exempt_tag,
            parse_time(detail.get("CreationTime")),
        )

    def _sagemaker_tags(self, detail: Mapping[str, Any]) -> dict[str, str]:
        arn = detail.get("TrainingJobArn")
        return self.sagemaker.tags(str(arn)) if arn else {}


def governance_from(deps: Any) -> Governance:
    """The use case over a `runtime.Dependencies` (what the handler and the embedded stack use)."""
    return Governance(
        sagemaker=deps.sagemaker,
        alarms=alarms_of(deps),
        store=deps.store,
        publisher=deps.publisher,
        notifier=notifier_of(deps),
        rules=rules_from(deps.settings),
        alarm_topic_arn=deps.settings.alarm_topic_arn,
        clock=deps.clock,
        teams=deps.settings.named_teams,
    )
