"""app/security/policy.py: the action each request needs, and the decision: allowed, 401, 403 or 404."""

from __future__ import annotations

import pytest

from app.domain.errors import ProtocolError
from app.security.policy import action_for, authorize, require_admin
from app.security.scopes import Action, Principal, parse_scopes

R, W, A = Action.READ, Action.WRITE, Action.ADMIN


@pytest.mark.parametrize(
    ("kind", "method", "action"),
    [
        # the stream itself
        (None, "GET", R),
        (None, "HEAD", R),
        (None, "OPTIONS", R),
        (None, "PUT", W),
        (None, "POST", W),
        (None, "DELETE", W),
        # a /ds bucket
        ("bucket", "GET", R),
        ("bucket", "HEAD", R),
        ("bucket", "PUT", A),
        ("bucket", "DELETE", A),
        # the /ds sub-resources
        ("attrs", "GET", R),
        ("attrs", "HEAD", R),
        ("attrs", "PUT", W),
        ("append-batch", "POST", W),
        ("bootstrap", "GET", R),
        ("snapshot", "GET", R),
        ("snapshot", "PUT", W),
        ("snapshot", "DELETE", A),
        ("retention", "PUT", A),
        # anything unknown that is not a read needs write, never less
        (None, "PATCH", W),
        ("attrs", "DELETE", W),
    ],
)
def test_action_for(kind: str | None, method: str, action: Action) -> None:
    assert action_for(kind, method) is action


NOT_FOUND = ProtocolError(404, "bucket_not_found", "bucket 'acme' does not exist")


def decide(scopes: list[str] | None, action: Action, public: bool = False) -> tuple[int, str] | None:
    """None when allowed; (status, code) otherwise."""
    principal = None if scopes is None else Principal("p", parse_scopes(scopes))
    try:
        authorize(principal, action, "acme", public, NOT_FOUND)
    except ProtocolError as exc:
        return exc.status, exc.code
    return None


UNAUTHORIZED = (401, "unauthorized")
FORBIDDEN = (403, "forbidden")
HIDDEN = (404, "bucket_not_found")


@pytest.mark.parametrize(
    ("scopes", "public", "decisions"),
    [
        # no token: 401 for everything, but reads of a public bucket
        (None, False, (UNAUTHORIZED, UNAUTHORIZED, UNAUTHORIZED)),
        (None, True, (None, UNAUTHORIZED, UNAUTHORIZED)),
        # a token for other buckets only: the bucket is invisible (404), unless it is public
        (["admin:zeta"], False, (HIDDEN, HIDDEN, HIDDEN)),
        (["admin:zeta"], True, (None, FORBIDDEN, FORBIDDEN)),
        # the bucket's own grants, in order
        (["read:acme"], False, (None, FORBIDDEN, FORBIDDEN)),
        (["write:acme"], False, (None, None, FORBIDDEN)),
        (["admin:acme"], False, (None, None, None)),
        (["read:acme"], True, (None, FORBIDDEN, FORBIDDEN)),
        # grants on every bucket
        (["read"], False, (None, FORBIDDEN, FORBIDDEN)),
        (["write:*"], False, (None, None, FORBIDDEN)),
        (["admin:*"], False, (None, None, None)),
        # the higher of the bucket's and the wildcard's grant
        (["read:*", "write:acme"], False, (None, None, FORBIDDEN)),
        (["write:*", "read:acme"], False, (None, None, FORBIDDEN)),
        (["read:acme", "admin:zeta"], False, (None, FORBIDDEN, FORBIDDEN)),
        # a token with no grant at all (its only scopes were another service's): invisible
        ([], False, (HIDDEN, HIDDEN, HIDDEN)),
        ([], True, (None, FORBIDDEN, FORBIDDEN)),
    ],
)
def test_decisions(scopes: list[str] | None, public: bool, decisions: tuple[tuple[int, str] | None, ...]) -> None:
    assert tuple(decide(scopes, action, public) for action in (R, W, A)) == decisions


def test_the_hidden_answer_is_the_callers_not_found() -> None:
    """The 404 is exactly the error the route passes in: the one a missing bucket or stream answers."""
    with pytest.raises(ProtocolError) as info:
        authorize(Principal("p", parse_scopes(["read:zeta"])), R, "acme", False, NOT_FOUND)
    assert info.value is NOT_FOUND


def test_401_carries_the_bare_challenge() -> None:
    with pytest.raises(ProtocolError) as info:
        authorize(None, W, "acme", True, NOT_FOUND)
    assert info.value.headers == {"www-authenticate": 'Bearer realm="rill"'}


def test_403_names_the_action_and_no_challenge() -> None:
    with pytest.raises(ProtocolError) as info:
        authorize(Principal("p", parse_scopes(["read:acme"])), A, "acme", False, NOT_FOUND)
    assert info.value.message == "the token may not admin in this bucket"
    assert "www-authenticate" not in info.value.headers


def test_require_admin() -> None:
    require_admin(Principal("root", parse_scopes(["admin:*"])))
    require_admin(Principal("root", parse_scopes(["admin"])))
    with pytest.raises(ProtocolError) as info:
        require_admin(None)
    assert (info.value.status, info.value.headers) == (401, {"www-authenticate": 'Bearer realm="rill"'})
    for scopes in (["admin:acme"], ["write:*"], ["read:*", "admin:acme", "admin:zeta"]):
        with pytest.raises(ProtocolError) as info:
            require_admin(Principal("p", parse_scopes(scopes)))
        assert (info.value.status, info.value.code) == (403, "forbidden"), scopes
