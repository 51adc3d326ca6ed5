"""Settings from the environment: parsing, defaults, and errors that name the variable."""

from __future__ import annotations

import pytest

from sagequeue_core.config import ConfigError, Settings, env_name, parse_capacity


def test_every_setting_reads_from_its_variable() -> None:
    settings = Settings.from_env(
        {
            "SAGEQUEUE_TABLE_NAME": "jobs",
            "SAGEQUEUE_CAPACITY": "ml.trn1.32xlarge=2, ml.trn2.48xlarge = 1",
            "SAGEQUEUE_ALLOWED_ROLE_ARNS": "arn:aws:iam::123456789012:role/A,arn:aws:iam::123456789012:role/B",
            "SAGEQUEUE_ADMIN_ROLE_ARNS": "",
            "SAGEQUEUE_MIN_RUNTIME_BEFORE_PREEMPTION_SECONDS": "120",
            "SAGEQUEUE_MAX_INSTANCES_PER_JOB": "0",
            "SAGEQUEUE_MAX_RUNTIME_SECONDS": "7200",
            "SAGEQUEUE_REQUIRED_TAGS": "team,project=^[a-z]+$",
            "SAGEQUEUE_IDLE_THRESHOLD_PERCENT": "2.5",
            "UNRELATED": "ignored",
        }
    )
    assert settings.table_name == "jobs"
    assert settings.capacity == {"ml.trn1.32xlarge": 2, "ml.trn2.48xlarge": 1}
    assert settings.allowed_role_arns == (
        "arn:aws:iam::123456789012:role/A",
        "arn:aws:iam::123456789012:role/B",
    )
    assert settings.admin_role_arns == ()
    assert settings.min_runtime_before_preemption_seconds == 120
    assert settings.max_instances_per_job is None, "0 from the stack parameter means no limit"
    assert settings.idle_threshold_percent == 2.5
    rules = settings.policy_rules
    assert rules.required_tags == {"team": None, "project": "^[a-z]+$"}
    assert rules.max_runtime_seconds == 7200


def test_defaults_are_documented_values() -> None:
    settings = Settings.from_env({})
    assert (settings.idle_threshold_percent, settings.idle_period_seconds, settings.idle_periods) == (
        5.0,
        300,
        6,
    )
    assert (settings.resume_after_failure_min_runtime_seconds, settings.max_resumes) == (600, 2)
    assert settings.max_spot_interruptions == 3
    assert settings.queue_lookahead == 50
    assert settings.capacity == {}
    assert settings.lend_reserved_capacity is True


@pytest.mark.parametrize(
    ("value", "expected"), [("false", False), ("True", True), (" 0 ", False), ("on", True)]
)
def test_lending_reads_the_stack_parameters_words(value: str, expected: bool) -> None:
    assert Settings.from_env({"SAGEQUEUE_LEND_RESERVED_CAPACITY": value}).lend_reserved_capacity is expected


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("SAGEQUEUE_CAPACITY", "trn1=2", "instance type"),
        ("SAGEQUEUE_CAPACITY", "ml.trn1.32xlarge=two", "non-negative integer"),
        ("SAGEQUEUE_CAPACITY", "ml.trn1.32xlarge=1,ml.trn1.32xlarge=2", "twice"),
        ("SAGEQUEUE_ALLOWED_ROLE_ARNS", "arn:aws:iam::123:user/other-user", "role ARN"),
        ("SAGEQUEUE_MAX_ATTEMPTS", "0", "greater than or equal to 1"),
        ("SAGEQUEUE_QUEUE_LOOKAHEAD", "many", "integer"),
        ("SAGEQUEUE_REQUIRED_TAGS", "team=([", "invalid pattern"),
        ("SAGEQUEUE_ALLOWED_INSTANCE_TYPES", "p5", "instance type"),
        ("SAGEQUEUE_DEFAULT_KEEP_ALIVE_SECONDS", "99999", "less than or equal to 21600"),
        ("SAGEQUEUE_LEND_RESERVED_CAPACITY", "maybe", "true or false"),
    ],
)
def test_an_invalid_value_names_its_variable(variable: str, value: str, words: str) -> None:
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({variable: value})
    assert variable in str(raised.value)
    assert words in str(raised.value)


def test_names_follow_the_stack_parameters() -> None:
    assert (
        env_name("min_runtime_before_preemption_seconds") == "SAGEQUEUE_MIN_RUNTIME_BEFORE_PREEMPTION_SECONDS"
    )
    assert parse_capacity("") == {}


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"max_attempts": True}, "integer"),
        ({"max_attempts": 2.5}, "integer"),
        ({"max_attempts": "5 attempts"}, "integer"),
        ({"idle_threshold_percent": "nan"}, "finite"),
        ({"idle_threshold_percent": "101"}, "less than or equal to 100"),
        ({"capacity": {"ml.trn1.32xlarge": -1}}, "negative"),
        ({"capacity": {"ml.trn1.32xlarge": "two"}}, "integer"),
        ({"capacity": ["ml.trn1.32xlarge"]}, "pairs"),
        ({"table_name": 7}, "string"),
        ({"admin_role_arns": ["arn:aws:iam::123456789012:role/A", 3]}, "principal"),
        ({"max_runtime_seconds": -5}, "greater than or equal to 1"),
        ({"lend_reserved_capacity": 1.5}, "true or false"),
    ],
)
def test_typed_values_are_checked_like_strings(values: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError) as raised:
        Settings.build(**values)
    assert env_name(next(iter(values))) in str(raised.value)
    assert words in str(raised.value)


def test_typed_values_are_accepted_and_normalised() -> None:
    settings = Settings.build(
        capacity={"ml.trn1.32xlarge": "2"},
        admin_role_arns=["arn:aws:iam::123456789012:role/A"],
        max_attempts=3.0,
        idle_threshold_percent=1,
        max_instances_per_job="",
    )
    assert settings.capacity == {"ml.trn1.32xlarge": 2}
    assert settings.admin_role_arns == ("arn:aws:iam::123456789012:role/A",)
    assert settings.max_attempts == 3
    assert isinstance(settings.max_attempts, int)
    assert settings.idle_threshold_percent == 1.0
    assert settings.max_instances_per_job is None


def test_every_problem_is_named_at_once_and_unknown_settings_are_refused() -> None:
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"SAGEQUEUE_MAX_ATTEMPTS": "0", "SAGEQUEUE_QUEUE_LOOKAHEAD": "many"})
    assert "SAGEQUEUE_MAX_ATTEMPTS" in str(raised.value)
    assert "SAGEQUEUE_QUEUE_LOOKAHEAD" in str(raised.value)
    with pytest.raises(ConfigError, match=r"unknown setting.*queue_look_ahead"):
        Settings.build(queue_look_ahead=3)


def test_settings_are_frozen_and_the_constructor_validates() -> None:
    settings = Settings()
    with pytest.raises(AttributeError):
        settings.max_attempts = 9  # type: ignore[misc]
    with pytest.raises(ConfigError, match="SAGEQUEUE_MAX_ATTEMPTS"):
        Settings(max_attempts=0)
    assert Settings.field_names()[0] == "table_name"
    assert "required_tags" in Settings.field_names()
