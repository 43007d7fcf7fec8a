"""app/security/scopes.py: parsing `action[:bucket]`, the order read < write < admin, and principals."""

from __future__ import annotations

import pytest

from app.security.scopes import ANY_BUCKET, Action, Principal, ScopeError, known_scopes, parse_scope, parse_scopes


@pytest.mark.parametrize(
    ("scope", "expected"),
    [
        ("read", (Action.READ, ANY_BUCKET)),
        ("write", (Action.WRITE, ANY_BUCKET)),
        ("admin", (Action.ADMIN, ANY_BUCKET)),
        ("read:*", (Action.READ, "*")),
        ("write:acme", (Action.WRITE, "acme")),
        ("admin:acme-prod_1", (Action.ADMIN, "acme-prod_1")),
        ("read:legacy.streams", (Action.READ, "legacy.streams")),
        ("write:compat.v1", (Action.WRITE, "compat.v1")),
        ("  read:acme  ", (Action.READ, "acme")),  # surrounding blanks are trimmed
    ],
)
def test_parse_scope(scope: str, expected: tuple[Action, str]) -> None:
    assert parse_scope(scope) == expected


@pytest.mark.parametrize(
    "scope",
    [
        *[
            "",
            "reader",
            "READ",
            "Read:acme",
            "delete:acme",
            "read:",
            "write:ac me",
            "admin:\tx",
            ":acme",
            "*",
            "openid",
        ],
        # buckets no bucket id can be: the scope would grant nothing, a typo kept silent
        *["read:ACME", "read:shop*", "read:shop/", "read:a:b", "read:acme,write:b", "read:abc", "write:" + "a" * 65],
    ],
)
def test_parse_scope_rejects(scope: str) -> None:
    with pytest.raises(ScopeError, match="a scope is read, write or admin"):
        parse_scope(scope)


def test_scope_error_is_a_value_error() -> None:
    """So pydantic reports a bad scope in the configuration as a validation error."""
    assert issubclass(ScopeError, ValueError)


def test_actions_are_ordered() -> None:
    assert Action.READ < Action.WRITE < Action.ADMIN


def test_parse_scopes_keeps_the_highest_action_per_bucket() -> None:
    grants = parse_scopes(["read:acme", "admin:acme", "write:acme", "write:zeta", "read:zeta", "read", "read:*"])
    assert grants == {"acme": Action.ADMIN, "zeta": Action.WRITE, "*": Action.READ}
    assert parse_scopes([]) == {}


def test_parse_scopes_raises_on_any_bad_scope() -> None:
    with pytest.raises(ScopeError):
        parse_scopes(["read:acme", "rw:acme"])


def test_known_scopes_drops_other_services_scopes_in_order() -> None:
    scopes = ["openid", "read:acme", "profile", "email", "write", "api:read", "admin:*", "read:"]
    assert known_scopes(scopes) == ["read:acme", "write", "admin:*"]


@pytest.mark.parametrize(
    ("scopes", "bucket", "level"),
    [
        ([], "acme", None),
        (["read:zeta"], "acme", None),
        (["read:acme"], "acme", Action.READ),
        (["write:acme"], "acme", Action.WRITE),
        (["read:*"], "acme", Action.READ),
        (["admin"], "acme", Action.ADMIN),
        (["write:*", "read:acme"], "acme", Action.WRITE),  # the wildcard lifts a lower grant
        (["read:*", "admin:acme"], "acme", Action.ADMIN),  # and the bucket's own grant lifts the wildcard
        (["read:*", "admin:acme"], "zeta", Action.READ),
        (["admin:acme"], "*", None),  # one bucket's grant is not a grant on every bucket
        (["admin:*"], "*", Action.ADMIN),
    ],
)
def test_principal_level(scopes: list[str], bucket: str, level: Action | None) -> None:
    assert Principal("p", parse_scopes(scopes)).level(bucket) == level


@pytest.mark.parametrize(
    ("scope", "allowed"),
    [
        ("read:acme", {Action.READ}),
        ("write:acme", {Action.READ, Action.WRITE}),
        ("admin:acme", {Action.READ, Action.WRITE, Action.ADMIN}),
    ],
)
def test_write_includes_read_and_admin_includes_both(scope: str, allowed: set[Action]) -> None:
    principal = Principal("p", parse_scopes([scope]))
    assert {a for a in Action if principal.may(a, "acme")} == allowed
    assert not any(principal.may(a, "zeta") for a in Action)


def test_expiry_is_exclusive_of_the_instant() -> None:
    principal = Principal("p", {}, expires_at=1_000)
    assert not principal.expired(999)
    assert principal.expired(1_000)
    assert principal.expired(5_000)
    assert not Principal("p").expired(2**62)  # no expiry: never
