"""`rill bench webhooks` measures what it says: every append it made is dated by a delivery."""

from __future__ import annotations

from app.bench.webhooks import WebhookOptions, run_webhooks


def test_every_append_is_delivered_and_timed() -> None:
    (result,) = run_webhooks(WebhookOptions(subscriptions=5, seconds=1.0, writers=2)).values()
    assert result["appends"] > 0 and result["appends_delivered"] == result["appends"]
    assert 0 < result["deliveries"] <= result["appends"]  # a delivery may cover several appends
    assert 0 < result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]
    assert result["server_cpu"] > 0
