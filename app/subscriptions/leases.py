"""A lease's bearer token, and how acknowledged positions appear outside the state machine.

A token is `{nonce}.{mac}`: an HMAC, under a key every node derives alike, of the subscription it
was issued for and a random nonce. Any node can tell a token it issued from a guess without a
look at the state, so a request with a made-up token is refused before anything is proposed, and
answers alike whether the subscription exists or not. Only the token's SHA-256 is replicated; a
stale but genuine token is fenced against the applied state.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from app.domain.offsets import acked_offset

__all__ = ["LeaseTokens", "acked_offset", "token_digest"]

_MAC_BYTES = 18


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class LeaseTokens:
    def __init__(self, key: bytes) -> None:
        self._key = key

    def _mac(self, bucket: str, root: str, sub_id: str, nonce: str) -> str:
        message = "\0".join((bucket, root, sub_id, nonce)).encode()
        digest = hmac.new(self._key, message, hashlib.sha256).digest()[:_MAC_BYTES]
        return base64.urlsafe_b64encode(digest).decode("ascii")

    def issue(self, bucket: str, root: str, sub_id: str, nonce: str | None = None) -> str:
        nonce = nonce if nonce is not None else secrets.token_urlsafe(18)
        return f"{nonce}.{self._mac(bucket, root, sub_id, nonce)}"

    def genuine(self, token: str, bucket: str, root: str, sub_id: str) -> bool:
        """Whether this cluster issued `token` for this subscription (at any generation)."""
        nonce, dot, mac = token.partition(".")
        if not dot or len(token) > 256:
            return False
        return hmac.compare_digest(mac.encode(), self._mac(bucket, root, sub_id, nonce).encode())
