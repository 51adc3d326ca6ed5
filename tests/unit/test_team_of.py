"""A job's team: from its submitter's IAM principal as the settings map it; a tag only confirms it."""

from __future__ import annotations

import pytest

from sagequeue_core.config import ConfigError, Settings
from sagequeue_core.errors import Forbidden
from sagequeue_core.service.access import (
    priority_ceiling,
    require_priority_allowed,
    submission_team,
    team_of_caller,
)

ACCOUNT = "123456789012"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/vision-ci"
USER = f"arn:aws:iam::{ACCOUNT}:user/ana"
ADMIN = f"arn:aws:iam::{ACCOUNT}:role/queue-admin"
ROLES = {ROLE: "vision", USER: "speech"}


def test_the_role_names_the_team_even_through_an_assumed_role_session_and_a_path() -> None:
    assert team_of_caller(ROLE, ROLES) == "vision"
    assert team_of_caller(f"arn:aws:sts::{ACCOUNT}:assumed-role/vision-ci/build-17", ROLES) == "vision"
    assert team_of_caller(f"arn:aws:sts::{ACCOUNT}:assumed-role/other/build-17", ROLES) is None
    assert team_of_caller(ROLE, {f"arn:aws:iam::{ACCOUNT}:role/ci/vision-ci": "vision"}) == "vision"


def test_an_iam_user_mapping_names_that_user_alone_and_no_role_of_another_account() -> None:
    assert team_of_caller(USER, ROLES) == "speech"
    # the mapping of one IAM user is not every IAM user's (two principals without a role name)
    assert team_of_caller(f"arn:aws:iam::{ACCOUNT}:user/bob", ROLES) is None
    assert team_of_caller("arn:aws:sts::999999999999:assumed-role/vision-ci/x", ROLES) is None


def test_a_team_tag_must_name_the_callers_team_unless_an_admin_submits() -> None:
    settings = Settings.build(team_roles=ROLES, admin_role_arns=[ADMIN], allowed_role_arns=[ROLE])
    assert submission_team("", ROLE, settings) == "vision"
    assert submission_team("vision", ROLE, settings) == "vision"
    with pytest.raises(Forbidden, match=r"you submit for team 'vision'.*not 'speech'"):
        submission_team("speech", ROLE, settings)
    with pytest.raises(Forbidden, match="mapped to no team"):
        submission_team("speech", f"arn:aws:iam::{ACCOUNT}:user/bob", settings)
    assert submission_team("", f"arn:aws:iam::{ACCOUNT}:user/bob", settings) is None
    assert (
        submission_team("speech", f"arn:aws:sts::{ACCOUNT}:assumed-role/queue-admin/a", settings) == "speech"
    )
    # a stack that maps nobody does not use teams: the tag is only a tag
    assert submission_team("speech", ROLE, Settings.build()) is None


def test_team_settings_are_parsed_and_bad_ones_named() -> None:
    settings = Settings.build(team_roles=f"{ROLE}=vision", team_tag="squad")
    assert settings.team_roles == {ROLE: "vision"}
    assert settings.team_tag == "squad"
    assert Settings.build().team_tag == "team"
    with pytest.raises(ConfigError, match="SAGEQUEUE_TEAM_ROLES: entry 'vision' must be <role ARN>=<team>"):
        Settings.build(team_roles="vision")
    with pytest.raises(ConfigError, match="SAGEQUEUE_TEAM_ROLES: 'nope' is not an IAM role ARN"):
        Settings.build(team_roles="nope=vision")
    with pytest.raises(ConfigError, match="team name 'a b'"):
        Settings.build(team_roles=f"{ROLE}=a b")


def test_team_execution_roles_are_parsed_named_and_held_to_the_allowed_roles() -> None:
    data = f"arn:aws:iam::{ACCOUNT}:role/vision-data"
    settings = Settings.build(
        allowed_role_arns=[ROLE, data], team_execution_roles=f"vision={data}, speech={data},vision={data}"
    )
    assert settings.team_execution_roles == {"vision": (data,), "speech": (data,)}
    assert settings.teams_of_role(data) == ("vision", "speech")
    assert settings.teams_of_role(ROLE) == ()
    with pytest.raises(
        ConfigError, match=r"SAGEQUEUE_TEAM_EXECUTION_ROLES: .*not among SAGEQUEUE_ALLOWED_ROLE"
    ):
        Settings.build(allowed_role_arns=[ROLE], team_execution_roles=f"vision={data}")
    with pytest.raises(ConfigError, match="entry 'vision' must be <team>=<role ARN>"):
        Settings.build(team_execution_roles="vision")


def test_with_two_teams_only_a_role_of_one_team_keeps_warm_pools_and_a_shared_one_is_warned_of(
    caplog: pytest.LogCaptureFixture,
) -> None:
    vision, shared = f"arn:aws:iam::{ACCOUNT}:role/vision-data", f"arn:aws:iam::{ACCOUNT}:role/shared-data"
    allowed = [ROLE, vision, shared]
    # one team or none: one tenant, every role keeps its pools
    assert Settings.build(allowed_role_arns=allowed).warm_pool_roles is None
    assert Settings.build(allowed_role_arns=allowed, team_roles={ROLE: "vision"}).warm_pool_roles is None
    with caplog.at_level("WARNING", logger="sagequeue"):
        settings = Settings.build(
            allowed_role_arns=allowed,
            team_roles=ROLES,
            team_execution_roles=f"vision={vision},vision={shared},speech={shared}",
        )
    assert settings.warm_pool_roles == frozenset({vision})
    assert settings.shared_execution_roles == {shared: ("vision", "speech")}
    (warning,) = [r.getMessage() for r in caplog.records if "warm pool" in r.getMessage()]
    assert shared in warning
    assert "vision, speech" in warning


def test_a_caller_mapped_to_no_team_gets_no_more_than_the_lowest_team_ceiling_where_teams_are_in_use() -> (
    None
):
    bob = f"arn:aws:iam::{ACCOUNT}:user/bob"
    settings = Settings.build(
        team_roles=ROLES, admin_role_arns=[ADMIN], priority_ceilings="vision=600,speech=300"
    )
    # GIVEN a member of speech (ceiling 300) who can also call as a principal nobody mapped
    assert priority_ceiling(USER, settings)[0] == 300
    # WHEN it calls unmapped THEN it gets the lowest team ceiling, not MaxPriorityForNonAdmins (900), named
    ceiling, whose = priority_ceiling(bob, settings)
    assert ceiling == 300
    with pytest.raises(
        Forbidden, match=r"priority 301 is above 300, the ceiling of callers mapped to no team"
    ):
        require_priority_allowed(301, bob, settings)
    assert "team 'speech'" in whose
    # AND a mapped team keeps its own ceiling, an unmapped principal its own entry, and an admin the top
    assert priority_ceiling(ROLE, settings)[0] == 600
    own = Settings.build(team_roles=ROLES, priority_ceilings=f"speech=300,{bob}=700")
    assert priority_ceiling(bob, own)[0] == 700
    require_priority_allowed(1000, f"arn:aws:sts::{ACCOUNT}:assumed-role/queue-admin/a", settings)
    # AND a team ceiling above MaxPriorityForNonAdmins does not raise the unmapped caller's
    assert priority_ceiling(bob, Settings.build(team_roles=ROLES, priority_ceilings="vision=950"))[0] == 900
    # AND where teams are not in use, MaxPriorityForNonAdmins is every non-admin's ceiling
    assert priority_ceiling(bob, Settings.build(priority_ceilings="speech=300"))[0] == 900
