"""Who may call the local API: access keys mapped to IAM principals, as IAM would map them.

On AWS, API Gateway's IAM authorization checks the SigV4 signature and fills the proxy event's
`requestContext.identity` with the caller's ARN. Locally there is no IAM, so the stack keeps a small table
of identities, each an access key with its secret and the principal it stands for. `sagequeue local`
prints them and saves the default one, so the CLI and the SDK sign as a real caller would, and the
ownership and admin rules of the API run unchanged.

The keys are derived from the stack's account id and the identity's name: stable across restarts of the
same local stack, meaningless anywhere else.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: The identity a saved connection and `LocalStack.client()` use unless told otherwise.
DEFAULT_IDENTITY = "user"
#: The role the admin identity assumes; the local stack lists it in admin_role_arns.
ADMIN_ROLE_NAME = "sagequeue-local-admin"


@dataclass(frozen=True)
class Identity:
    """One caller of the local API."""

    name: str
    access_key_id: str
    secret_access_key: str
    #: requestContext.identity.userArn: an IAM user ARN or an STS assumed-role ARN
    arn: str
    #: requestContext.identity.caller: the user id, or `<role id>:<session>` for an assumed role
    caller: str
    account_id: str
    admin: bool = False
    #: The role ARN an assumed-role identity stands for (what admin_role_arns names), else None.
    role_arn: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "access_key_id": self.access_key_id,
            "secret_access_key": self.secret_access_key,
            "arn": self.arn,
            "caller": self.caller,
            "account_id": self.account_id,
            "admin": self.admin,
            "role_arn": self.role_arn,
        }


def _derived(account_id: str, name: str, purpose: str, length: int) -> str:
    digest = hashlib.sha256(f"sagequeue-local/{account_id}/{name}/{purpose}".encode()).digest()
    return base64.b32encode(digest).decode().rstrip("=")[:length]


def user_identity(account_id: str, name: str) -> Identity:
    """An IAM user `sagequeue-local-<name>`."""
    user_id = "AIDA" + _derived(account_id, name, "user-id", 17)
    return Identity(
        name=name,
        access_key_id="AKIA" + _derived(account_id, name, "key", 16),
        secret_access_key=_derived(account_id, name, "secret", 40),
        arn=f"arn:aws:iam::{account_id}:user/sagequeue-local-{name}",
        caller=user_id,
        account_id=account_id,
    )


def assumed_role_identity(account_id: str, name: str, role_name: str, *, admin: bool = False) -> Identity:
    """A session `<name>` of role `role_name`, as `sts:AssumeRole` would give it."""
    role_id = "AROA" + _derived(account_id, role_name, "role-id", 17)
    return Identity(
        name=name,
        access_key_id="ASIA" + _derived(account_id, name, "key", 16),
        secret_access_key=_derived(account_id, name, "secret", 40),
        arn=f"arn:aws:sts::{account_id}:assumed-role/{role_name}/{name}",
        caller=f"{role_id}:{name}",
        account_id=account_id,
        admin=admin,
        role_arn=f"arn:aws:iam::{account_id}:role/{role_name}",
    )


def default_identities(account_id: str) -> dict[str, Identity]:
    """Two ordinary users (`user`, `other`: ownership rules need a second one) and an admin."""
    identities = [
        user_identity(account_id, DEFAULT_IDENTITY),
        user_identity(account_id, "other"),
        assumed_role_identity(account_id, "admin", ADMIN_ROLE_NAME, admin=True),
    ]
    return {identity.name: identity for identity in identities}


class IdentityTable:
    """Access key id -> identity, as the local API gateway authorizes requests."""

    def __init__(self, identities: Iterable[Identity]) -> None:
        self._by_name: dict[str, Identity] = {}
        self._by_key: dict[str, Identity] = {}
        for identity in identities:
            self.add(identity)

    def add(self, identity: Identity) -> None:
        if identity.access_key_id in self._by_key:
            raise ValueError(f"access key {identity.access_key_id} is already used by another identity")
        self._by_name[identity.name] = identity
        self._by_key[identity.access_key_id] = identity

    def by_key(self, access_key_id: str) -> Identity | None:
        return self._by_key.get(access_key_id)

    def __getitem__(self, name: str) -> Identity:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(
                f"no local identity named {name!r}; known: {', '.join(sorted(self._by_name))}"
            ) from None

    def __iter__(self) -> Any:
        return iter(self._by_name.values())

    def admin_arns(self) -> list[str]:
        """What admin_role_arns must list so the admin identities are admins: their role ARNs (and, for
        users, their own ARNs)."""
        return [identity.role_arn or identity.arn for identity in self if identity.admin]

    def to_dict(self) -> Mapping[str, Any]:
        return {identity.name: identity.to_dict() for identity in self}
