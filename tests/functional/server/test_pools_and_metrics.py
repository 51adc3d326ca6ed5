"""Several pools: heterogeneous jobs count in each group's pool; a pass reports queue metrics (EMF)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import TRN1, TRN2, QueueWorld, make_world, training_request


@pytest.fixture
def two_pools(moto_endpoint: str) -> Iterator[QueueWorld]:
    yield from make_world(moto_endpoint, capacity={TRN1: 2, TRN2: 1})


def heterogeneous(name: str, trn1: int, trn2: int) -> dict[str, Any]:
    body = training_request(name, duration=600)
    body["ResourceConfig"] = {
        "InstanceGroups": [
            {"InstanceGroupName": "workers", "InstanceType": TRN1, "InstanceCount": trn1},
            {"InstanceGroupName": "leader", "InstanceType": TRN2, "InstanceCount": trn2},
        ],
        "VolumeSizeInGB": 100,
    }
    return body


def test_a_heterogeneous_job_takes_instances_from_each_groups_pool(two_pools: QueueWorld) -> None:
    world = two_pools
    status, job = world.api("POST", "/jobs", heterogeneous("mixed", trn1=1, trn2=1))
    assert status == 201
    assert (job["pool"], job["instances"]) == (TRN1, 2)
    assert world.state("mixed") == "starting"

    # one trn1 instance is left, but the trn2 pool is full: a trn2 job waits, a trn1 job starts
    world.submit("needs-trn2", instance_type=TRN2)
    world.submit("needs-trn1", instance_type=TRN1)
    assert world.state("needs-trn2") == "queued"
    assert world.state("needs-trn1") == "starting"
    pools = {p["instance_type"]: p for p in world.api("GET", "/pools")[1]["pools"]}
    assert (pools[TRN1]["used"], pools[TRN2]["used"], pools[TRN2]["queued"]) == (2, 1, 1)


def test_a_heterogeneous_job_larger_than_a_pool_is_refused(two_pools: QueueWorld) -> None:
    status, answer = two_pools.api("POST", "/jobs", heterogeneous("too-big", trn1=1, trn2=2))
    assert status == 400
    assert TRN2 in answer["message"]


def test_a_pass_publishes_queue_depth_and_oldest_wait_per_pool(
    world: QueueWorld, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("m1", "m2", "m3"):
        world.submit(name, duration=3600)
    world.clock.advance(90)
    capsys.readouterr()

    world.timer()

    documents = [
        json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"_aws"')
    ]
    gauges = {
        (d["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Name"], d.get("Pool")): d
        for d in documents
        if d.get("Pool")
    }
    assert gauges[("QueueDepth", TRN1)]["QueueDepth"] == [1.0]
    assert gauges[("OldestQueuedWaitSeconds", TRN1)]["OldestQueuedWaitSeconds"] == [90.0]
    assert gauges[("QueueDepth", TRN1)]["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "SageQueue"
