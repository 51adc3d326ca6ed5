"""Who may do what: the caller's identity from the API's request context, owners and admins."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from sagequeue_core.domain import Job
from sagequeue_core.errors import Forbidden

_ASSUMED_ROLE = re.compile(r"arn:(aws[a-z-]*):sts::(\d{12}):assumed-role/([^/]+)/.+")
_ROLE = re.compile(r"arn:(aws[a-z-]*):iam::(\d{12}):role/(?:.*/)?([^/]+)")


def principal(arn: str) -> str:
    """The role behind an ARN: a role's sessions are the role (`account:role/name`), anything else itself.
    Admins and owners are both compared this way: a session name is chosen by whoever assumes the role, so
    it identifies nobody, and the same person's next session must still own yesterday's jobs."""
    assumed = _ASSUMED_ROLE.fullmatch(arn)
    if assumed:
        return f"{assumed.group(1)}:{assumed.group(2)}:role/{assumed.group(3)}"
    role = _ROLE.fullmatch(arn)
    if role:
        return f"{role.group(1)}:{role.group(2)}:role/{role.group(3)}"
    return arn


def owner_of_caller(arn: str) -> str:
    """The owner recorded for a caller: the IAM role behind an assumed-role session
    (`arn:aws:iam::<account>:role/<name>`), any other principal as it is."""
    assumed = _ASSUMED_ROLE.fullmatch(arn)
    if assumed:
        return f"arn:{assumed.group(1)}:iam::{assumed.group(2)}:role/{assumed.group(3)}"
    return arn


def same_principal(a: str, b: str) -> bool:
    return principal(a) == principal(b)


def is_admin(caller: str, admin_arns: Iterable[str]) -> bool:
    return any(same_principal(caller, admin) for admin in admin_arns)


def require_caller(caller: str | None) -> str:
    if not caller:
        raise Forbidden("the request carries no caller identity (IAM authentication is required)")
    return caller


def require_owner_or_admin(job: Job, caller: str, admin_arns: Iterable[str]) -> None:
    if same_principal(job.owner, caller) or is_admin(caller, admin_arns):
        return
    raise Forbidden(f"only the owner of job {job.name!r} or an admin may change it")


def priority_ceiling(caller: str, settings: Any) -> tuple[int, str]:
    """The highest priority a non-admin caller may use, and whose ceiling it is: the caller's principal's
    entry in PriorityCeilings, else its team's, else MaxPriorityForNonAdmins.

    Where teams are in use (TeamRoles), a caller mapped to no team gets no more than the lowest team
    ceiling: a team member who can also call as a principal nobody mapped (another role, an IAM user)
    must not escape the team's ceiling that way."""
    mine = principal(caller)
    team = team_of_caller(caller, settings.team_roles)
    for key, ceiling in settings.priority_ceilings.items():
        if key.startswith("arn:") and principal(key) == mine:
            return ceiling, f"the ceiling of {owner_of_caller(caller)} (PriorityCeilings)"
    if team is not None and team in settings.priority_ceilings:
        return settings.priority_ceilings[team], f"the ceiling of team {team!r} (PriorityCeilings)"
    default = settings.max_priority_for_non_admins
    if team is None and settings.team_roles:
        teams = {k: c for k, c in settings.priority_ceilings.items() if not k.startswith("arn:")}
        lowest = min(teams, key=lambda k: teams[k], default=None)
        if lowest is not None and teams[lowest] < default:
            return teams[lowest], (
                f"the ceiling of callers mapped to no team (TeamRoles): the lowest team ceiling, team "
                f"{lowest!r}'s (PriorityCeilings)"
            )
    return default, "the ceiling of non-admins (MaxPriorityForNonAdmins)"


def require_priority_allowed(priority: int, caller: str, settings: Any) -> None:
    """Forbidden when a non-admin asks for a priority above its ceiling (priority_ceiling), naming it."""
    if is_admin(caller, settings.admin_role_arns):
        return
    ceiling, whose = priority_ceiling(caller, settings)
    if priority > ceiling:
        raise Forbidden(f"priority {priority} is above {ceiling}, {whose}")


def team_of_caller(caller: str, team_roles: Mapping[str, str]) -> str | None:
    """The team an admin mapped the caller's IAM principal to (`TeamRoles`), or None.

    The principal is compared whole, account included: a role's sessions are the role, an IAM user is
    itself. Nothing the caller writes (a tag, a session name, a body field) enters the comparison."""
    mine = principal(caller)
    for mapped, team in team_roles.items():
        if principal(mapped) == mine:
            return team
    return None


def submission_team(tagged: str, caller: str, settings: Any) -> str | None:
    """The team a submission runs for: the caller's mapped team. A team tag must name that very team
    (Forbidden otherwise, naming it); only an admin may submit for any team, by its tag. A stack that maps
    no principal to a team (TeamRoles empty) does not use teams: there the tag of a non-admin is an
    ordinary tag and the job has no team."""
    mine = team_of_caller(caller, settings.team_roles)
    if not tagged or tagged == mine:
        return mine
    if is_admin(caller, settings.admin_role_arns):
        return tagged
    if not settings.team_roles:
        return None
    tag = settings.team_tag
    if mine is None:
        raise Forbidden(
            f"tag {tag!r}: your IAM principal is mapped to no team (TeamRoles), so you may not submit for "
            f"team {tagged!r}; leave the tag out"
        )
    raise Forbidden(f"tag {tag!r}: you submit for team {mine!r} (your IAM principal's), not {tagged!r}")


def require_role_allowed(role_arn: str, team: str | None, caller: str, settings: Any) -> None:
    """Forbidden when the execution role belongs to teams (TeamExecutionRoles) the caller's job is not
    of; an admin may pass any allowed role."""
    owners = settings.teams_of_role(role_arn)
    if not owners or team in owners or is_admin(caller, settings.admin_role_arns):
        return
    whose = f"team{'s' if len(owners) > 1 else ''} {', '.join(repr(t) for t in owners)}"
    yours = f"your team is {team!r}" if team else "your IAM principal is mapped to no team"
    raise Forbidden(f"RoleArn {role_arn!r} is the execution role of {whose}; {yours}")


def require_admin(caller: str, admin_arns: Iterable[str], what: str) -> None:
    if not is_admin(caller, admin_arns):
        raise Forbidden(f"only an admin may {what}")
