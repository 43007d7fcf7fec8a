"""A follower's answer to a request only the leader can serve: a 307 to the same request there."""

from __future__ import annotations

from starlette.types import Scope

from app.domain.errors import error_body
from app.protocol.errors import error_reply
from app.protocol.http import Reply


def leader_redirect(leader: str | None, scope: Scope) -> Reply:
    """307 to the same request on the leader, or 503 while no leader is known."""
    if leader is None:
        return error_reply(503, "no_leader", "no leader is known yet; retry shortly", {"retry-after": "1"})
    body = error_body("not_leader", "this node does not lead the cluster; follow the redirect")
    return Reply(307, {"location": leader_target(leader, scope), "content-type": "application/json"}, body)


def leader_target(leader: str, scope: Scope) -> str:
    """The same path and query on the leader, as the client sent them."""
    query = scope.get("query_string", b"")
    path = scope.get("raw_path", b"").decode("latin-1")
    return leader + path + ("?" + query.decode("latin-1") if query else "")
