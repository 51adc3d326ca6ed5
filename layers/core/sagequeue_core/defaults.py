"""Every constant that more than one part of sagequeue must agree on, documented in one place.

This module imports nothing: the job image, the Lambda layer, the SageMaker emulator and the CLI all read
it, and none of them should pay for another's dependencies.
"""

from __future__ import annotations

# --- NeuronCore utilization: published by the job image, read by the idle alarm --------------------------

#: CloudWatch namespace of the metrics that sagequeue-job publishes. SageMaker's own namespace
#: (/aws/sagemaker/TrainingJobs) has no NeuronCore metric, so the job image publishes under its own.
NEURON_METRIC_NAMESPACE = "SageQueue/TrainingJobs"

#: Environment variable the scheduler sets on every attempt of a queued job: the namespace its job image
#: publishes to. A team's jobs publish under NEURON_METRIC_NAMESPACE + "/<team>" (team_metric_namespace),
#: where only that team's execution roles may publish (docs/guardrails.md); a job without one publishes under
#: NEURON_METRIC_NAMESPACE itself.
METRIC_NAMESPACE_ENV = "SAGEQUEUE_METRIC_NAMESPACE"


def team_metric_namespace(team: str | None) -> str:
    """The namespace a team's jobs publish their utilization to, and their idle alarms read: one per team,
    so that a grant conditioned on `cloudwatch:namespace` keeps one team's job roles out of another's."""
    return f"{NEURON_METRIC_NAMESPACE}/{team}" if team else NEURON_METRIC_NAMESPACE


#: Average NeuronCore utilization of one host over the last period, in percent (0-100).
NEURONCORE_UTILIZATION_METRIC = "NeuronCoreUtilization"

#: 1 while a neuronx-cc or neuron_parallel_compile process runs on the host, else 0 (Maximum per period):
#: a cold compile takes 30-60 minutes at ~0% NeuronCore utilization and is not idleness.
NEURON_COMPILING_METRIC = "NeuronCompiling"

#: The one dimension of every per-host metric, the same name and value format SageMaker uses:
#: "<training job name>/algo-<n>", n counting hosts from 1.
HOST_DIMENSION = "Host"

#: SageMaker's own training metrics (CPUUtilization, GPUUtilization, ...) live here, also keyed by Host.
SAGEMAKER_METRIC_NAMESPACE = "/aws/sagemaker/TrainingJobs"

#: How often a host reports utilization, in seconds (CloudWatch standard resolution).
METRIC_PERIOD_SECONDS = 60


def host_dimension_value(training_job_name: str, host_index: int) -> str:
    """The Host dimension of host `host_index` (1-based) of a training job."""
    if host_index < 1:
        raise ValueError(f"host_index counts from 1, got {host_index}")
    return f"{training_job_name}/algo-{host_index}"


# --- Events ------------------------------------------------------------------------------------------------

#: Source and detail type of SageMaker's training job events on the default bus.
SAGEMAKER_EVENT_SOURCE = "aws.sagemaker"
TRAINING_JOB_STATE_CHANGE = "SageMaker Training Job State Change"

#: Source of the events sagequeue publishes (JobQueued, JobStarted, ...).
SAGEQUEUE_EVENT_SOURCE = "sagequeue"

# --- Scheduling -------------------------------------------------------------------------------------------

#: How long a quota learned from ResourceLimitExceeded limits a pool. SageMaker's answer is the only word
#: on the account's quota sagequeue gets; after this long the pool's configured capacity is tried again,
#: so a raised quota is noticed without anyone telling the stack.
QUOTA_MEMORY_SECONDS = 600
#: How long an attempt's intent (recorded before CreateTrainingJob) may go without SageMaker knowing its
#: training job before the reconcile calls it never created: the pass that wrote it may still be inside its
#: CreateTrainingJob until the scheduler's timeout (120 s in template.yaml), and a pass beside it (reserved
#: concurrency 1 makes that rare, not impossible) must not free what the create is about to take.
INTENT_IN_FLIGHT_SECONDS = 180
#: SageMaker's StoppingCondition.MaxRuntimeInSeconds when a request leaves it out (one day): a running
#: attempt has trained at most this long.
SAGEMAKER_DEFAULT_MAX_RUNTIME_SECONDS = 86_400
#: How long a quota SageMaker stated in its refusal ("... is N Instances, with current utilization of M")
#: limits a pool. It is SageMaker's own figure, not a guess from what the queue held, so it is kept much
#: longer; a create of the type that succeeds beyond it forgets it at once.
STATED_QUOTA_MEMORY_SECONDS = 6 * 3600

# --- Tags --------------------------------------------------------------------------------------------------

#: A job's priority may come from this tag (an integer) when the request carries no explicit priority.
PRIORITY_TAG = "priority"
#: Set on every attempt: the IAM principal (ARN) that submitted the job, from the API's request context.
SUBMITTED_BY_TAG = "sagequeue:submitted-by"
#: Set on every attempt: the queue entry it belongs to and its attempt number.
JOB_TAG = "sagequeue:job"
ATTEMPT_TAG = "sagequeue:attempt"
#: Set on every attempt: its seal, an HMAC of its name under a secret the queue entry keeps in the table (never
#: returned by the API). Anyone may set the two tags above; only the scheduler can set a seal that verifies,
#: so a training job counts as an attempt of a queue entry only with it (docs/adr/0006-governance-trust.md).
SEAL_TAG = "sagequeue:seal"
#: An admin sets this tag (value "true") to exempt a job from the tag and policy rules and the idle stop.
EXEMPT_TAG = "sagequeue:exempt"
#: An exemption granted by the name of a training job that does not exist yet covers the first training job
#: of that name created within this long after the grant, and no other (docs/guardrails.md).
EXEMPTION_WINDOW_SECONDS = 3600

# --- Names -------------------------------------------------------------------------------------------------

#: SageMaker's pattern for a training job name, and its maximum length.
TRAINING_JOB_NAME_PATTERN = r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$"
TRAINING_JOB_NAME_MAX_LENGTH = 63

#: Idle alarms are named "<prefix><training job name>/algo-<n>", so IAM can scope PutMetricAlarm to them.
IDLE_ALARM_PREFIX = "sagequeue-idle-"

# --- Job image ---------------------------------------------------------------------------------------------

#: Environment variable naming the remote NEFF cache (hf://org/repo or s3://bucket/prefix).
NEFF_CACHE_ENV = "SAGEQUEUE_NEFF_CACHE"
#: Where SageMaker mounts the warm pool's persistent cache on a reused instance.
WARMPOOL_CACHE_ENV = "SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY"
#: The Neuron compiler's default cache root.
DEFAULT_NEURON_CACHE_DIR = "/var/tmp/neuron-compile-cache"  # noqa: S108 - the Neuron SDK's fixed default

# --- Instance families -------------------------------------------------------------------------------------

#: Instance families whose accelerators are NeuronCores (Trainium, Inferentia).
NEURON_INSTANCE_FAMILIES = ("trn1", "trn1n", "trn2", "trn2u", "inf1", "inf2")
#: Families with NVIDIA GPUs, whose idle signal is SageMaker's GPUUtilization.
GPU_INSTANCE_FAMILIES = (
    "p2",
    "p3",
    "p3dn",
    "p4d",
    "p4de",
    "p5",
    "p5e",
    "p5en",
    "p6",
    "g4dn",
    "g5",
    "g6",
    "g6e",
)


def instance_family(instance_type: str) -> str:
    """`ml.trn1.32xlarge` -> `trn1`."""
    parts = instance_type.split(".")
    if len(parts) != 3 or parts[0] != "ml":
        raise ValueError(f"not a SageMaker instance type: {instance_type!r} (expected ml.<family>.<size>)")
    return parts[1]


def is_neuron_instance(instance_type: str) -> bool:
    return instance_family(instance_type) in NEURON_INSTANCE_FAMILIES


def is_gpu_instance(instance_type: str) -> bool:
    return instance_family(instance_type) in GPU_INSTANCE_FAMILIES
