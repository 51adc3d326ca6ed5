"""Who is who: a role's sessions are the role; admins by role or user ARN."""

from __future__ import annotations

import pytest

from sagequeue_core.errors import Forbidden
from sagequeue_core.service.access import is_admin, principal, require_caller, same_principal

ROLE = "arn:aws:iam::123456789012:role/team/Research"
SESSION = "arn:aws:sts::123456789012:assumed-role/Research/research-session"


def test_a_roles_sessions_are_the_role() -> None:
    assert principal(SESSION) == principal(ROLE) == "aws:123456789012:role/Research"
    assert same_principal(SESSION, SESSION.replace("research-session", "another-session"))


def test_users_and_other_accounts_are_distinct() -> None:
    assert not same_principal("arn:aws:iam::123456789012:user/research-session", SESSION)
    assert not same_principal(SESSION, SESSION.replace("123456789012", "210987654321"))


def test_admins_by_role_cover_their_sessions() -> None:
    assert is_admin(SESSION, [ROLE])
    assert not is_admin(SESSION, ["arn:aws:iam::123456789012:role/Other"])


def test_no_identity_is_forbidden() -> None:
    with pytest.raises(Forbidden):
        require_caller(None)
