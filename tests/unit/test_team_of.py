"""A job's team: from its tag, else from the caller's role as the settings map it."""

from __future__ import annotations

import pytest

from sagequeue_core.config import ConfigError, Settings
from sagequeue_core.domain import team_of

ROLE = "arn:aws:iam::123456789012:role/vision-ci"
ROLES = {ROLE: "vision"}


def test_the_tag_names_the_team_before_the_role() -> None:
    request = {"Tags": [{"Key": "team", "Value": "speech"}]}
    assert team_of(request, ROLE, tag="team", roles=ROLES) == "speech"
    assert team_of({"Tags": [{"Key": "group", "Value": "x"}]}, ROLE, tag="group", roles=ROLES) == "x"


def test_the_role_names_the_team_of_an_untagged_job_even_through_an_assumed_role_session() -> None:
    assert team_of({}, ROLE, tag="team", roles=ROLES) == "vision"
    session = "arn:aws:sts::123456789012:assumed-role/vision-ci/build-17"
    assert team_of({}, session, tag="team", roles=ROLES) == "vision"
    assert (
        team_of({}, "arn:aws:sts::123456789012:assumed-role/other/build-17", tag="team", roles=ROLES) is None
    )
    assert team_of({"Tags": [{"Key": "team", "Value": "  "}]}, None, tag="team", roles=ROLES) is None


def test_team_settings_are_parsed_and_bad_ones_named() -> None:
    settings = Settings.build(team_roles=f"{ROLE}=vision", team_tag="squad")
    assert settings.team_roles == ROLES
    assert settings.team_tag == "squad"
    assert Settings.build().team_tag == "team"
    with pytest.raises(ConfigError, match="SAGEQUEUE_TEAM_ROLES: entry 'vision' must be <role ARN>=<team>"):
        Settings.build(team_roles="vision")
    with pytest.raises(ConfigError, match="SAGEQUEUE_TEAM_ROLES: 'nope' is not an IAM role ARN"):
        Settings.build(team_roles="nope=vision")
    with pytest.raises(ConfigError, match="team name 'a b'"):
        Settings.build(team_roles=f"{ROLE}=a b")
