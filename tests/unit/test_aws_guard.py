"""The guard of the scheduler, governance and end-to-end suites: an emulator kinder than AWS fails the test
unless a `Kinder` names each departure and why."""

from __future__ import annotations

from pathlib import Path

from support.aws_guard import guarded, unexplained

from sagequeue.local.emulator import Kinder, SageMakerEmulator, aws_options

TESTS = Path(__file__).resolve().parents[1]


def test_the_server_governance_and_e2e_suites_are_guarded_and_the_emulators_own_tests_are_not() -> None:
    assert guarded(TESTS / "functional" / "server" / "test_api.py")
    assert guarded(TESTS / "functional" / "governance" / "test_governance_service.py")
    assert guarded(TESTS / "e2e" / "test_cli.py")
    assert not guarded(TESTS / "functional" / "emulator" / "test_emulator_capacity.py")
    assert not guarded(TESTS / "unit" / "test_policy.py")


def test_a_kinder_emulator_is_reported_unless_its_kinder_names_each_departure() -> None:
    aws = aws_options(region_capacity={"ml.trn1.32xlarge": 2})
    assert unexplained(SageMakerEmulator(**aws)) == []
    short_grace = SageMakerEmulator(**{**aws, "stop_grace_seconds": 30})
    assert unexplained(short_grace) == ["stop grace shorter than SageMaker's 120 s"]
    in_order = SageMakerEmulator(
        **aws_options(region_capacity={"ml.trn1.32xlarge": 2}, exactly_once_in_order=True)
    )
    assert unexplained(in_order) == ["events delivered once, at once or in order", "no event is ever lost"]
    named = SageMakerEmulator(
        **{**aws, "stop_grace_seconds": 30, "kinder": Kinder("a fast clock", "stop_grace")}
    )
    assert unexplained(named) == []
    half = SageMakerEmulator(
        **{
            **aws,
            "stop_grace_seconds": 30,
            "transient_error_share": 0.0,
            "kinder": Kinder("fast", "stop_grace"),
        }
    )
    assert unexplained(half) == ["no 5xx answers"]
    assert unexplained(SageMakerEmulator()) == [
        "no event is ever lost",
        "no 5xx answers",
    ], "the emulator's own defaults: lossless, faultless, no job yet"
