"""A hostile review of #27: a user of one team, with the rights a typical ML user holds, attacks another
team's jobs on the local stack end to end.

GIVEN sagequeue's whole stack with two teams (`user` is vision, the victim; `other` is speech, the
attacker, whose ceiling is 300) and, in the account, what an ordinary user holds: the queue API, and on
SageMaker CreateTrainingJob and AddTags on the jobs it creates, PutMetricData as every job role has it,
WHEN the attacker tries to outrank, stop, keep alive, crowd out or block the victim's jobs,
THEN each test asserts the safe behaviour. A test marked xfail(strict=True) is an attack that succeeds
today: its reason names the hole.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from test_forged_sagequeue_tags import tags_of
from test_hostile_tenants import POOL, request, states, unique, until

from sagequeue.client import ApiError
from sagequeue.local import LocalStack
from sagequeue_core.defaults import (
    HOST_DIMENSION,
    NEURON_METRIC_NAMESPACE,
    NEURONCORE_UTILIZATION_METRIC,
    host_dimension_value,
    team_metric_namespace,
)
from sagequeue_core.governance import CLONE_OF_TAG

PLAN = "plan:shared"
FAST = {"provisioning_seconds": 60, "download_seconds": 10, "upload_seconds": 10}
TEAMS = {"user": "vision", "other": "speech"}
SPEECH_CEILING = 300
IDLE_PERIODS, IDLE_PERIOD = 3, 300


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    running = LocalStack(
        settings={
            "capacity": {POOL: 2, PLAN: 1},
            "min_runtime_before_preemption_seconds": 0,
            "idle_periods": IDLE_PERIODS,
            "idle_period_seconds": IDLE_PERIOD,
            "priority_ceilings": f"speech={SPEECH_CEILING}",
            "resume_after_failure_min_runtime_seconds": 60,
        },
        # the region launches the pools and the training jobs created outside the queue; the account raised
        # its warm-pool quota (AWS's default, 0, retains no pool)
        emulator={**FAST, "capacity": {POOL: 5}, "warm_pool_limits": {POOL: 2}},
        function_logs=False,
        teams=TEAMS,
        # a function's failure is recorded, and each test asserts none it did not expect (no_failures)
        raise_function_errors=False,
    )
    running.start()
    yield running
    running.stop()


@pytest.fixture(autouse=True)
def no_failures(stack: LocalStack, request: pytest.FixtureRequest) -> Iterator[None]:
    """No function fails in a test, unless it is an attack that succeeds (xfail): that test looks itself."""
    before = len(stack.failures)
    yield
    if request.node.get_closest_marker("xfail") is None:
        assert [f.error for f in stack.failures[before:]] == []


def cancel_all(stack: LocalStack) -> None:
    admin = stack.client("admin")
    for pool in (POOL, PLAN):
        for job in admin.jobs(pool=pool):
            if not job.terminal:
                admin.cancel(job.name)
    until(stack, lambda: all(job.terminal for p in (POOL, PLAN) for job in admin.jobs(pool=p)), 900)


# --- team and priority by tag: defended -----------------------------------------------------------------------


def test_team_and_priority_tags_in_a_submission_take_neither_another_team_nor_a_higher_priority(
    stack: LocalStack,
) -> None:
    speech = stack.client("other")
    # WHEN the attacker pads the victim's team name, or asks for a priority above its ceiling by tag
    for tags, status, named in (
        ([{"Key": "team", "Value": " vision "}], 403, "not 'vision'"),
        ([{"Key": "priority", "Value": str(SPEECH_CEILING + 1)}], 403, f"above {SPEECH_CEILING}"),
    ):
        with pytest.raises(ApiError) as refused:
            speech.submit(request(stack, unique("pad"), 60, Tags=tags))
        # THEN it is refused, naming why
        assert refused.value.status == status
        assert named in str(refused.value)
    # AND a tag key that differs from `team` in case is an ordinary tag: the job is speech's
    cased = unique("cased")
    speech.submit(request(stack, cased, 60, Tags=[{"Key": "Team", "Value": "vision"}]))
    assert speech.job(cased).raw["team"] == "speech"
    cancel_all(stack)


def test_a_priority_tag_added_on_sagemaker_to_a_running_attempt_changes_nothing(stack: LocalStack) -> None:
    speech = stack.client("other")
    mine = unique("mine")
    speech.submit(request(stack, mine, 3600), priority=SPEECH_CEILING)
    until(stack, lambda: states(speech)[mine] == "running", limit=600)
    attempt = speech.job(mine).training_job_name
    assert attempt is not None
    # WHEN the attacker tags its own running attempt with the top priority (AddTags on its own job)
    arn = stack.sagemaker.describe_training_job(TrainingJobName=attempt)["TrainingJobArn"]
    stack.sagemaker.add_tags(ResourceArn=arn, Tags=[{"Key": "priority", "Value": "1000"}])
    stack.advance(180)
    # THEN the queue keeps the priority it admitted
    assert speech.job(mine).priority == SPEECH_CEILING
    cancel_all(stack)


# --- a team's plan pool: defended by its quota ------------------------------------------------------------------


def test_a_plan_pool_held_by_a_teams_quota_is_not_taken_by_another_teams_job(stack: LocalStack) -> None:
    vision, speech, admin = stack.client("user"), stack.client("other"), stack.client("admin")
    plan = f"arn:aws:sagemaker:{stack.region}:{stack.account_id}:training-plan/shared"
    # GIVEN vision's quota holds the whole plan pool and lends none of it
    admin.set_team_quota("vision", PLAN, 1, lending_limit=0)
    try:
        # WHEN speech submits a job on the plan first, at its ceiling, while the plan is free
        theirs, ours = unique("on-plan"), unique("plan-owner")
        body = request(stack, theirs, 3600)
        body["ResourceConfig"] = {**body["ResourceConfig"], "TrainingPlanArn": plan}
        speech.submit(body, priority=SPEECH_CEILING)
        stack.advance(300)
        # THEN it waits, and vision's job at priority 0 takes the plan
        assert speech.job(theirs).state == "queued"
        body = request(stack, ours, 600)
        body["ResourceConfig"] = {**body["ResourceConfig"], "TrainingPlanArn": plan}
        vision.submit(body, priority=0)
        until(stack, lambda: vision.job(ours).state == "running", limit=900)
        assert speech.job(theirs).state == "queued"
        cancel_all(stack)
    finally:
        admin.set_team_quota("vision", PLAN, None)


# --- a training job started outside the queue on a managed pool -----------------------------------------------


def test_a_training_job_created_outside_the_queue_on_a_full_pool_stops_no_queued_job(
    stack: LocalStack,
) -> None:
    vision = stack.client("user")
    running = [unique("steady"), unique("steady")]
    for name in running:
        vision.submit(request(stack, name, 3600), priority=1)
    until(stack, lambda: all(states(vision)[n] == "running" for n in running), limit=600)
    # WHEN the attacker, allowed sagemaker:CreateTrainingJob, starts a job of the pool's type outside the queue
    outside = unique("outside")
    stack.sagemaker.create_training_job(**request(stack, outside, 900))
    for _ in range(5):
        stack.advance(180)
        # THEN the victim's running jobs keep running
        assert all(states(vision)[n] == "running" for n in running), states(vision)
    cancel_all(stack)


# --- warm pools: matched by execution role, across teams ------------------------------------------------------


def test_another_teams_job_does_not_start_on_a_teams_warm_pool(stack: LocalStack) -> None:
    vision, speech = stack.client("user"), stack.client("other")
    long, short, warm, theirs = unique("long"), unique("short"), unique("warm"), unique("theirs")
    # GIVEN vision fills the pool, and queues a job that asks for no warm pool behind a short one
    vision.submit(request(stack, long, 3600), priority=2)
    vision.submit(request(stack, short, 60), priority=2)
    until(stack, lambda: all(states(vision)[n] == "running" for n in (long, short)), limit=600)
    vision.submit(request(stack, warm, 120), priority=2)
    # AND speech queues a job with the same instances, volume and (shared) execution role, below it
    speech.submit(request(stack, theirs, 600), priority=1)
    try:
        until(stack, lambda: states(speech)[theirs] == "running", limit=1200)
        # THEN speech's job does not start on the instances vision's job ended on
        pool = stack.sagemaker.describe_training_job(TrainingJobName=warm).get("WarmPoolStatus") or {}
        attempt = speech.job(theirs).training_job_name
        assert pool.get("ReusedByJob") != attempt, pool
    finally:
        cancel_all(stack)


# --- the idle signal: another tenant can keep an idle job busy ------------------------------------------------


def forge_busy(stack: LocalStack, training_job_name: str, namespace: str = NEURON_METRIC_NAMESPACE) -> None:
    """What a principal allowed cloudwatch:PutMetricData in `namespace` can publish for any host: a job
    role without a team in the default namespace, a team's job role (the documented grant) in its team's."""
    stack.aws_client("cloudwatch").put_metric_data(
        Namespace=namespace,
        MetricData=[
            {
                "MetricName": NEURONCORE_UTILIZATION_METRIC,
                "Dimensions": [{"Name": HOST_DIMENSION, "Value": host_dimension_value(training_job_name, 1)}],
                "Timestamp": stack.now(),
                "Value": 100.0,
                "Unit": "Percent",
            }
        ],
    )


@pytest.mark.parametrize(
    "namespace",
    [NEURON_METRIC_NAMESPACE, team_metric_namespace("speech")],
    ids=["default-namespace", "attackers-team-namespace"],
)
def test_forged_busy_datapoints_do_not_keep_another_teams_idle_job_running(
    stack: LocalStack, namespace: str
) -> None:
    vision = stack.client("user")
    idle = unique("idle")
    vision.submit(request(stack, idle, 7200, outcome="Idle"), priority=1)
    until(stack, lambda: states(vision)[idle] == "running", limit=600)
    try:
        # WHEN the attacker publishes one busy datapoint a period for the idle job's host, where its roles
        # may publish: the default namespace, or its own team's (speech's job role, as the docs grant it)
        for _ in range(IDLE_PERIODS + 2):
            forge_busy(stack, idle, namespace)
            stack.advance(IDLE_PERIOD)
        # THEN the idle job is stopped all the same, as its own data says: its alarm reads vision's namespace
        assert states(vision)[idle] in ("stopping", "idle_stopped")
        alarm = stack.aws_client("cloudwatch").describe_alarms(AlarmNamePrefix=f"sagequeue-idle-{idle}/")
        watched = {
            query["MetricStat"]["Metric"]["Namespace"]
            for found in alarm["MetricAlarms"]
            for query in found.get("Metrics") or ()
            if "MetricStat" in query
        }
        assert watched <= {team_metric_namespace("vision")}, watched
    finally:
        cancel_all(stack)


def test_a_teams_jobs_publish_to_and_are_judged_in_their_teams_namespace_and_a_busy_one_keeps_running(
    stack: LocalStack,
) -> None:
    vision = stack.client("user")
    busy = unique("busy")
    vision.submit(request(stack, busy, 7200), priority=1)
    until(stack, lambda: states(vision)[busy] == "running", limit=600)
    attempt = vision.job(busy).training_job_name
    assert attempt is not None
    try:
        # GIVEN the scheduler told the attempt where to publish: vision's namespace
        environment = stack.sagemaker.describe_training_job(TrainingJobName=attempt)["Environment"]
        assert environment["SAGEQUEUE_METRIC_NAMESPACE"] == team_metric_namespace("vision")
        # WHEN zeros are published for its host in the default namespace and in speech's, for two windows
        for _ in range(2 * IDLE_PERIODS):
            for namespace in (NEURON_METRIC_NAMESPACE, team_metric_namespace("speech")):
                stack.aws_client("cloudwatch").put_metric_data(
                    Namespace=namespace,
                    MetricData=[
                        {
                            "MetricName": NEURONCORE_UTILIZATION_METRIC,
                            "Dimensions": [
                                {"Name": HOST_DIMENSION, "Value": host_dimension_value(attempt, 1)}
                            ],
                            "Timestamp": stack.now(),
                            "Value": 0.0,
                            "Unit": "Percent",
                        }
                    ]
                    * 20,
                )
            stack.advance(IDLE_PERIOD)
        # THEN the busy job runs on: neither its idle nor its silence alarm reads them
        assert states(vision)[busy] == "running"
    finally:
        cancel_all(stack)


# --- a priority tag beside an explicit priority -----------------------------------------------------------------


def test_a_priority_tag_above_the_ceiling_beside_an_explicit_priority_is_refused_and_one_within_follows_it(
    stack: LocalStack,
) -> None:
    speech = stack.client("other")
    # WHEN the attacker gives its ceiling explicitly and a priority tag of 1000 beside it
    with pytest.raises(ApiError) as refused:
        speech.submit(
            request(stack, unique("sleeper"), 60, Tags=[{"Key": "priority", "Value": "1000"}]),
            priority=SPEECH_CEILING,
        )
    # THEN it is refused, naming the tag and the ceiling
    assert refused.value.status == 403
    assert f"tag 'priority': priority 1000 is above {SPEECH_CEILING}" in str(refused.value)
    # AND a tag within the ceiling is queued at the explicit priority, the tag on SageMaker saying the same
    mine = unique("tagged")
    speech.submit(
        request(stack, mine, 600, Tags=[{"Key": "priority", "Value": "7"}]), priority=SPEECH_CEILING
    )
    assert speech.job(mine).priority == SPEECH_CEILING
    until(stack, lambda: states(speech)[mine] == "running", limit=600)
    attempt = speech.job(mine).training_job_name
    assert attempt is not None
    assert tags_of(stack, attempt)["priority"] == str(SPEECH_CEILING)
    cancel_all(stack)


# --- resumes of jobs started outside the queue ------------------------------------------------------------------


def resumes_of(stack: LocalStack, root: str) -> list[str]:
    summaries = stack.sagemaker.list_training_jobs(NameContains=root, MaxResults=100)["TrainingJobSummaries"]
    names = sorted(s["TrainingJobName"] for s in summaries if s["TrainingJobName"] != root)
    return [n for n in names if tags_of(stack, n).get(CLONE_OF_TAG) == root]


def test_a_training_job_created_under_a_clones_name_does_not_cost_another_teams_job_its_resume(
    stack: LocalStack,
) -> None:
    failing = "Failed:InternalServerError: We encountered an internal error."
    control, victim, tagged = unique("control"), unique("victim"), unique("tagged")
    victims = (control, victim, tagged)
    before = len(stack.failures)
    # GIVEN three jobs of vision started outside the queue, each to fail on SageMaker's side after training
    # long enough for a resume
    for name in victims:
        stack.sagemaker.create_training_job(**request(stack, name, 300, outcome=failing))
    # AND the attacker, allowed sagemaker:CreateTrainingJob, creates a victim's clone name ahead; and, with a
    # sagequeue:* tag the docs tell operators to deny, another's, tagged as that job's clone
    stack.sagemaker.create_training_job(**request(stack, f"{victim}--2", 30))
    squatter = request(stack, f"{tagged}--2", 30, Tags=[{"Key": CLONE_OF_TAG, "Value": tagged}])
    stack.sagemaker.create_training_job(**squatter)
    # WHEN they fail (their Failed events sent again, in case the emulator lost them)
    until(stack, lambda: all(status(stack, n) == "Failed" for n in victims), limit=1200)
    for name in victims:
        replay(stack, name)
    stack.run_until_idle()
    try:
        # THEN the control is resumed as <control>--2, and each victim too, under a name of its own
        assert resumes_of(stack, control) == [f"{control}--2"]
        failures = [f.error for f in stack.failures[before:]]
        assert resumes_of(stack, victim), failures
        assert f"{victim}--2" not in resumes_of(stack, victim)
        assert [n for n in resumes_of(stack, tagged) if n != f"{tagged}--2"], resumes_of(stack, tagged)
        assert failures == []
    finally:
        clones = [n for root in victims for n in resumes_of(stack, root)]
        for name in clones:
            if status(stack, name) == "InProgress":
                stack.sagemaker.stop_training_job(TrainingJobName=name)
        until(stack, lambda: all(status(stack, n) != "InProgress" for n in clones), 600)


def status(stack: LocalStack, name: str) -> str:
    return str(stack.sagemaker.describe_training_job(TrainingJobName=name)["TrainingJobStatus"])


def replay(stack: LocalStack, name: str) -> None:
    """Send the training job's current state again, as SageMaker does on a duplicated delivery."""
    detail = stack.sagemaker.describe_training_job(TrainingJobName=name)
    detail.pop("ResponseMetadata", None)
    detail["Tags"] = tags_of(stack, name)
    stack.aws_client("events").put_events(
        Entries=[
            {
                "Source": "aws.sagemaker",
                "DetailType": "SageMaker Training Job State Change",
                "Resources": [detail["TrainingJobArn"]],
                "Detail": json.dumps(detail, default=str),
            }
        ]
    )


# --- a lost table: the plain priority tag is trusted ----------------------------------------------------------


def lose_table(stack: LocalStack) -> None:
    """The table restored from an old backup or recreated: every item gone."""
    dynamodb = stack.aws_client("dynamodb")
    assert stack.spec is not None
    for table in stack.spec.tables:
        keys = [
            t["AttributeName"] for t in dynamodb.describe_table(TableName=table.name)["Table"]["KeySchema"]
        ]
        for page in dynamodb.get_paginator("scan").paginate(TableName=table.name, ConsistentRead=True):
            for item in page.get("Items", []):
                dynamodb.delete_item(TableName=table.name, Key={k: item[k] for k in keys})


def test_after_a_lost_table_an_attackers_job_comes_back_no_higher_than_its_ceiling(stack: LocalStack) -> None:
    """Run last in the module: it empties the stack's table."""
    vision, speech, admin = stack.client("user"), stack.client("other"), stack.client("admin")
    mine = [unique("sleeper"), unique("sleeper")]
    # GIVEN the attacker fills the pool at its ceiling, then tags its running attempts with a `priority` of
    # 1000 on SageMaker (AddTags on its own jobs; the API refuses such a tag at submit)
    for name in mine:
        speech.submit(request(stack, name, 3600), priority=SPEECH_CEILING)
        assert speech.job(name).priority == SPEECH_CEILING
    until(stack, lambda: all(states(speech)[n] == "running" for n in mine), limit=600)
    for name in mine:
        attempt = speech.job(name).training_job_name
        assert attempt is not None
        arn = stack.sagemaker.describe_training_job(TrainingJobName=attempt)["TrainingJobArn"]
        stack.sagemaker.add_tags(ResourceArn=arn, Tags=[{"Key": "priority", "Value": "1000"}])
        assert tags_of(stack, attempt).get("priority") == "1000"
    owner = admin.job(mine[0]).raw["owner"]
    # WHEN the table is lost and the reconcile enters the live attempts again from their tags
    lose_table(stack)
    until(stack, lambda: {j.name for j in admin.jobs(state="running")} >= set(mine), limit=600)
    # THEN the victim's job at 900, above the attacker's ceiling, still preempts one of them and starts
    urgent = unique("urgent")
    vision.submit(request(stack, urgent, 600), priority=900)
    waited = 0
    while vision.job(urgent).state != "running":
        priorities = {n: admin.job(n).priority for n in mine}
        assert waited < 600, f"{urgent} still {vision.job(urgent).state}: the pool is held at {priorities}"
        stack.advance(60)
        waited += 60
    # AND the attacker's jobs came back at the lowest standing (docs/adr/0015): no higher than their owner's
    # ceiling, drawing on no team's quota, owned by nobody who could raise them again
    for name in mine:
        back = admin.job(name)
        assert back.priority <= SPEECH_CEILING, back.priority
        assert back.raw["team"] is None
        assert back.raw["owner"] != owner


def test_after_a_lost_table_a_teams_jobs_are_judged_where_they_publish_busy_kept_idle_stopped(
    stack: LocalStack,
) -> None:
    """Run last in the module: it empties the stack's table. Its teams share one execution role, so the
    table cannot tell a rebuilt job's team from its role: its alarms read what its own Environment names."""
    cancel_all(stack)
    vision, admin = stack.client("user"), stack.client("admin")
    busy, idle = unique("busy"), unique("idle")
    vision.submit(request(stack, busy, 7200), priority=1)
    vision.submit(request(stack, idle, 7200, outcome="Idle"), priority=1)
    until(stack, lambda: states(vision)[busy] == states(vision)[idle] == "running", limit=600)
    attempts = {name: vision.job(name).training_job_name for name in (busy, idle)}
    # GIVEN the table is lost while both of vision's jobs run, publishing to vision's namespace as told
    lose_table(stack)
    until(stack, lambda: {j.name for j in admin.jobs(state="running")} >= {busy, idle}, limit=300)
    assert admin.job(busy).raw["team"] is None  # the role is everyone's: no team to enter it with
    # WHEN two idle windows and two periods pass (past the silence window, which is two idle windows)
    window = IDLE_PERIODS * IDLE_PERIOD
    for _ in range((2 * window + 2 * IDLE_PERIOD) // 60):
        stack.advance(60)
    # THEN the busy job still runs: its alarms read vision's namespace, where its job image publishes
    assert admin.job(busy).state == "running", admin.job(busy).raw.get("reason")
    assert status(stack, str(attempts[busy])) == "InProgress"
    alarms = stack.aws_client("cloudwatch").describe_alarms(
        AlarmNamePrefix=f"sagequeue-idle-{attempts[busy]}/"
    )
    watched = {
        query["MetricStat"]["Metric"]["Namespace"]
        for found in alarms["MetricAlarms"]
        for query in found.get("Metrics") or ()
        if "MetricStat" in query
    }
    assert watched == {team_metric_namespace("vision")}, watched
    # AND the truly idle one was stopped as idle, as before the table was lost
    until(stack, lambda: admin.job(idle).state == "idle_stopped", limit=600)
    cancel_all(stack)
