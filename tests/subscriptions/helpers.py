"""Shared by the subscription tests that run real clusters."""

from __future__ import annotations

import time

import httpx


def claim(url: str, worker: str, deadline: float) -> dict[str, object]:
    """Claims the subscription, retrying while the cluster elects a leader or an old lease runs out."""
    while True:
        try:
            response = httpx.post(url + "/claim", json={"worker": worker}, timeout=5)
            if response.status_code == 200:
                return dict(response.json())
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "no claim was granted"
        time.sleep(0.2)
