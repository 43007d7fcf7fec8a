"""Reading a node's /metrics as numbers."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str, headers: dict[str, str] | None = None) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of `url`/metrics: (sample name, its labels) -> value."""
    response = httpx.get(url + "/metrics", headers=headers or {}, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    """One sample's value; 0 for a labelled series not exported yet."""
    return samples.get((name, frozenset(labels.items())), 0.0)
