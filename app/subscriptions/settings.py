"""What a node needs to serve subscriptions: the webhook signing key and the networks a webhook
may reach besides public addresses."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.subscriptions.signing import WebhookSigner
from app.subscriptions.urls import Network


@dataclass(frozen=True)
class WebhookSettings:
    signer: WebhookSigner
    allowed: list[Network] = field(default_factory=list)
