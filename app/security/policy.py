"""Access decisions: which action a request needs, and whether its principal may take it.

A bucket the caller cannot see answers exactly as a missing one does (404), so private names
cannot be probed; a caller who can see it but lacks the action gets 403; no token, 401.
"""

from __future__ import annotations

from app.domain.errors import ProtocolError
from app.security.authenticator import unauthorized
from app.security.scopes import Action, Principal

# (sub-resource, method) pairs that need more than the method's default; None is the stream itself.
_ADMIN = {("bucket", "PUT"), ("bucket", "DELETE"), ("retention", "PUT"), ("snapshot", "DELETE")}
_READS = {"GET", "HEAD", "OPTIONS"}


def action_for(kind: str | None, method: str) -> Action:
    """The action a request needs: `kind` is None for a stream, "bucket", or a /ds sub-resource."""
    if (kind, method) in _ADMIN:
        return Action.ADMIN
    return Action.READ if method in _READS else Action.WRITE


def authorize(
    principal: Principal | None, action: Action, bucket: str, public_read: bool, not_found: ProtocolError
) -> None:
    """Returns if allowed; raises the 401, 403 or (for a bucket the caller cannot see) `not_found`."""
    if principal is not None and principal.may(action, bucket):
        return
    if action is Action.READ and public_read:
        return
    if principal is None:
        raise unauthorized("this needs a bearer token")
    if not public_read and principal.level(bucket) is None:
        raise not_found
    raise ProtocolError(403, "forbidden", f"the token may not {action.name.lower()} in this bucket")


def require_admin(principal: Principal | None) -> None:
    """Cluster-wide operations (membership, node details) need admin on every bucket."""
    if principal is None:
        raise unauthorized("this needs a bearer token with the admin scope")
    if not principal.may(Action.ADMIN, "*"):
        raise ProtocolError(403, "forbidden", "this needs the admin scope on every bucket (admin:*)")
