"""The webhook signing key: shared by a cluster's nodes, signatures a receiver can check."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from app.subscriptions.signing import WebhookSigner, _unb64url, verify

NOW = 1_790_000_000


def test_nodes_with_one_secret_share_the_key_and_another_secret_does_not() -> None:
    a, b = WebhookSigner.from_secret(b"s3cret"), WebhookSigner.from_secret(b"s3cret")
    assert a.public_bytes == b.public_bytes and a.kid == b.kid and a.kid.startswith("ds_")
    assert WebhookSigner.from_secret(b"other").kid != a.kid
    with pytest.raises(ValueError):
        WebhookSigner.from_secret(b"")


def test_the_jwks_publishes_the_public_key() -> None:
    signer = WebhookSigner.from_secret(b"s3cret")
    (key,) = signer.jwks()["keys"]
    assert key == {"kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "use": "sig", "kid": signer.kid, "x": key["x"]}
    assert "d" not in key  # never the private part
    Ed25519PublicKey.from_public_bytes(_unb64url(key["x"]))


def test_a_signature_verifies_and_any_change_breaks_it() -> None:
    signer = WebhookSigner.from_secret(b"s3cret")
    body = b'{"subscription_id":"s1"}'
    header = signer.sign(body, NOW)
    assert header.startswith(f"t={NOW},kid={signer.kid},ed25519=")
    jwks = signer.jwks()
    assert verify(header, body, jwks, NOW + 10)
    assert not verify(header, body + b" ", jwks, NOW)  # another body
    assert not verify(header.replace(f"t={NOW}", f"t={NOW + 1}"), body, jwks, NOW)  # another time
    assert not verify(header, body, jwks, NOW + 301)  # too old
    assert not verify(header, body, WebhookSigner.from_secret(b"other").jwks(), NOW)  # another key
    assert not verify("ed25519=abc", body, jwks, NOW)


def test_a_single_nodes_key_is_kept_in_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "webhook.key"
    first = WebhookSigner.from_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert WebhookSigner.from_file(path).kid == first.kid  # the same key after a restart
    path.write_bytes(b"short")
    with pytest.raises(ValueError):
        WebhookSigner.from_file(path)
