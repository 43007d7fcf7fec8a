"""Lease tokens (app/subscriptions/leases.py): a node tells a token it issued for a subscription
from anything else without looking at the state, and every node of a cluster tells alike."""

from __future__ import annotations

from app.subscriptions.leases import LeaseTokens
from app.subscriptions.settings import WebhookSettings
from app.subscriptions.signing import WebhookSigner


def test_a_token_is_genuine_for_its_own_subscription_only() -> None:
    tokens = LeaseTokens(b"k" * 32)
    token = tokens.issue("b", "root", "s1")
    assert tokens.genuine(token, "b", "root", "s1")
    for other in (("b", "root", "s2"), ("b", "", "s1"), ("c", "root", "s1"), ("b", "root/s1", "")):
        assert not tokens.genuine(token, *other)
    assert tokens.issue("b", "root", "s1") != token  # a fresh nonce each time


def test_made_up_and_altered_tokens_are_not_genuine() -> None:
    tokens = LeaseTokens(b"k" * 32)
    nonce, mac = tokens.issue("b", "", "s").split(".")
    altered = mac[:-1] + ("B" if mac.endswith("A") else "A")  # one in 64 MACs ends in A already
    for forged in ("", "junk", "a.b", f"{nonce}.", f".{mac}", f"{nonce}x.{mac}", f"{nonce}.{altered}", "x" * 300):
        assert not tokens.genuine(forged, "b", "", "s"), forged
    assert not LeaseTokens(b"j" * 32).genuine(f"{nonce}.{mac}", "b", "", "s")  # another cluster's key


def test_every_node_of_a_cluster_derives_the_same_key() -> None:
    first = WebhookSettings(WebhookSigner.from_secret(b"cluster secret")).leases
    second = WebhookSettings(WebhookSigner.from_secret(b"cluster secret")).leases
    other = WebhookSettings(WebhookSigner.from_secret(b"another secret")).leases
    token = first.issue("b", "", "s")
    assert second.genuine(token, "b", "", "s") and not other.genuine(token, "b", "", "s")
