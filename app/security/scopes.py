"""Scopes: `read`, `write` or `admin`, on one bucket or on `*`, written `action:bucket`.

They are ordered: `write` includes `read`, and `admin` includes both. A bare action (`read`)
means that action on every bucket.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from app.domain.names import BUCKET_ID
from app.state_machine.table import BUILTIN_BUCKETS

ANY_BUCKET = "*"


class Action(IntEnum):
    READ = 1
    WRITE = 2
    ADMIN = 3


_ACTIONS = {"read": Action.READ, "write": Action.WRITE, "admin": Action.ADMIN}


class ScopeError(ValueError):
    pass


def parse_scope(scope: str) -> tuple[Action, str]:
    """`write:acme` -> (WRITE, "acme"); `admin` -> (ADMIN, "*"). The bucket is one a bucket id can
    name, or a route family's: `read:ACME` or `read:shop*` would grant nothing, a typo kept silent."""
    name, sep, bucket = scope.strip().partition(":")
    action = _ACTIONS.get(name)
    named = not sep or bucket == ANY_BUCKET or bucket in BUILTIN_BUCKETS or BUCKET_ID.fullmatch(bucket)
    if action is None or not named:
        raise ScopeError(
            f"a scope is read, write or admin, optionally :bucket (a bucket id: 4 to 64 of a-z, 0-9, _ and -) "
            f"or :*; got {scope[:200]!r}"
        )
    return action, bucket or ANY_BUCKET


def parse_scopes(scopes: list[str]) -> dict[str, Action]:
    """The highest action held on each bucket (or on `*`)."""
    grants: dict[str, Action] = {}
    for scope in scopes:
        action, bucket = parse_scope(scope)
        grants[bucket] = max(action, grants.get(bucket, action))
    return grants


def known_scopes(scopes: list[str]) -> list[str]:
    """The scopes of a JWT that are Rill's: other services' scopes in the same token are ignored."""
    kept = []
    for scope in scopes:
        try:
            parse_scope(scope)
        except ScopeError:
            continue
        kept.append(scope)
    return kept


@dataclass(frozen=True)
class Principal:
    subject: str
    grants: dict[str, Action] = field(default_factory=dict)
    expires_at: int | None = None  # ms since the epoch; None: never

    def level(self, bucket: str) -> Action | None:
        """The highest action this principal holds on `bucket`, or None."""
        own, anywhere = self.grants.get(bucket), self.grants.get(ANY_BUCKET)
        if own is None or anywhere is None:
            return own or anywhere
        return max(own, anywhere)

    def may(self, action: Action, bucket: str) -> bool:
        level = self.level(bucket)
        return level is not None and level >= action

    def expired(self, now_ms: int) -> bool:
        return self.expires_at is not None and now_ms >= self.expires_at
