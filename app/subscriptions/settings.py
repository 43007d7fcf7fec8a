"""What a node needs to serve subscriptions: the webhook signing key, the lease tokens' key (both
the same on every node of a cluster), and the networks a webhook may reach besides public addresses."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from app.subscriptions.leases import LeaseTokens
from app.subscriptions.signing import WebhookSigner
from app.subscriptions.urls import Network


@dataclass(frozen=True)
class WebhookSettings:
    signer: WebhookSigner
    allowed: list[Network] = field(default_factory=list)
    leases: LeaseTokens = field(init=False)

    def __post_init__(self) -> None:
        seed = self.signer.key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        key = hashlib.sha256(b"rill lease tokens v1\0" + seed).digest()  # not the signing key itself
        object.__setattr__(self, "leases", LeaseTokens(key))
