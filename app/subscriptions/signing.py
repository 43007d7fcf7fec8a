"""The Ed25519 key that signs webhook deliveries, its JWKS, and the `Webhook-Signature` header.

Every node of a cluster must sign with the same key, since any of them may lead: the key is derived
from the cluster secret (HKDF-SHA256), so it is never stored nor sent anywhere. A single node
without a secret keeps a random key in a file of its data directory instead.

A signature covers `{t}.{body}`, where `t` is the sending time in Unix seconds; the header reads
`t=<seconds>,kid=<key id>,ed25519=<base64url signature>`.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

HEADER = "webhook-signature"
JWKS_MEDIA_TYPE = "application/jwk-set+json"
TOLERANCE_SECONDS = 300  # how far a receiver should let `t` stray from its clock
_INFO = b"rill webhook signing key v1"
_SIGNATURE = re.compile(r"t=(\d{1,12}),kid=([^,]+),ed25519=([A-Za-z0-9_-]+)")


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class WebhookSigner:
    key: Ed25519PrivateKey

    @classmethod
    def from_secret(cls, secret: bytes) -> WebhookSigner:
        """The cluster's key: the same on every node that shares `secret`."""
        if not secret:
            raise ValueError("a cluster's webhook key needs the cluster secret")
        seed = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(secret)
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    @classmethod
    def from_file(cls, path: Path) -> WebhookSigner:
        """A single node's key, made on first use and kept (owner-only) in `path`."""
        try:
            seed = path.read_bytes()
        except FileNotFoundError:
            seed = os.urandom(32)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(seed)
        if len(seed) != 32:
            raise ValueError(f"{path} does not hold a 32-byte Ed25519 seed")
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    @property
    def public_bytes(self) -> bytes:
        return self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    @property
    def kid(self) -> str:
        """`ds_` and a digest of the public key: a new key gets a new id."""
        return "ds_" + _b64url(hashlib.sha256(self.public_bytes).digest()[:12])

    def jwks(self) -> dict[str, list[dict[str, str]]]:
        return {
            "keys": [
                {
                    "kty": "OKP",
                    "crv": "Ed25519",
                    "x": _b64url(self.public_bytes),
                    "kid": self.kid,
                    "alg": "EdDSA",
                    "use": "sig",
                }
            ]
        }

    def sign(self, body: bytes, now_seconds: int) -> str:
        signature = self.key.sign(f"{now_seconds}.".encode() + body)
        return f"t={now_seconds},kid={self.kid},ed25519={_b64url(signature)}"


def verify(header: str, body: bytes, jwks: dict[str, list[dict[str, str]]], now_seconds: int) -> bool:
    """What a receiver checks: the header's form, a key of the JWKS, the time, the signature."""
    match = _SIGNATURE.fullmatch(header)
    if match is None:
        return False
    t, kid, signature = int(match[1]), match[2], match[3]
    if abs(now_seconds - t) > TOLERANCE_SECONDS:
        return False
    key = next((k for k in jwks.get("keys", []) if k.get("kid") == kid and k.get("crv") == "Ed25519"), None)
    if key is None:
        return False
    try:
        public = Ed25519PublicKey.from_public_bytes(_unb64url(key["x"]))
        public.verify(_unb64url(signature), f"{t}.".encode() + body)
    except (InvalidSignature, ValueError, KeyError):
        return False
    return True
