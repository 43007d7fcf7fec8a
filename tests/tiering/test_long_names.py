"""Long stream ids and one failing stream, end to end: real `rill serve` processes tiering to a
directory and to moto's S3 server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from app.tiering import keys
from tests.moto import MotoS3
from tests.server import RillProcess
from tests.tiering.test_cold_tier import AWS_ENV, OCTET, read_all, tiering, wait_for

LONG = "long-" + "a" * 295  # 300 characters
CJK = "日本語のストリーム名前" * 3  # 33 characters, 99 bytes
KIB = "k" * 1024
FAST = ("--segment-max-age", "0.2", "--local-disk-budget", "0")
# No packs: these tests are about each stream's own directory (tests/tiering/test_packing.py has packs).
FAST_ENV = {"RILL_TIERING_INTERVAL": "0.1", "RILL_PACK_BELOW_BYTES": "0"}


def url(name: str) -> str:
    return f"/ds/limits/{quote(name, safe='')}"


def write(client: httpx.Client, name: str, data: bytes) -> None:
    if client.head(url(name)).status_code == 404:
        assert client.put(url(name), headers=OCTET).status_code == 201
    r = client.post(url(name), content=data, headers=OCTET)
    assert r.status_code == 204, r.text


def untiered(node: RillProcess) -> int:
    return int(tiering(node.url)["untiered_bytes"])


def test_long_ids_tier_and_a_failing_stream_blocks_no_other(tmp_path: Path) -> None:
    cold = tmp_path / "cold"
    blocker = cold / "limits" / "blocked"
    blocker.parent.mkdir(parents=True)
    blocker.write_bytes(b"a regular file where the stream's directory must go")
    budget = ("--hot-backlog-budget", "20000")
    node = RillProcess(tmp_path / "n", None, "--cold-store", cold.as_uri(), *FAST, *budget, env=FAST_ENV).start()
    written: dict[str, bytes] = {}
    try:
        with httpx.Client(base_url=node.url, timeout=10) as client:
            assert client.put("/ds/limits").status_code == 201
            for name in ("blocked", "short", LONG, CJK, KIB):
                data = (name[:10] + "|").encode() * 100  # 600 to 3,100 bytes
                write(client, name, data)
                written[name] = data
            stuck = len(written["blocked"])
            wait_for(lambda: untiered(node) == stuck, what="every stream but the blocked one to tier")
            status = tiering(node.url)
            assert status["available"] is True and status["failing_count"] == 1
            (failure,) = status["failing"]
            assert (failure["bucket"], failure["stream"]) == ("limits", "blocked")
            assert "Not a directory" in failure["error"] and failure["attempts"] >= 1 and failure["retry_in_s"] >= 0

            for name in (LONG, CJK, KIB):
                directory = cold / "limits" / keys.stream_component(name)
                assert directory.name.startswith("!h-") and list((directory / "segments").glob("*.parquet"))
                manifest = json.loads((directory / "manifest.json").read_bytes())
                assert (manifest["bucket"], manifest["stream"]) == ("limits", name)
            wait_for(lambda: tiering(node.url)["local_bytes"] == stuck, what="eviction of the tiered streams")
            for name, data in written.items():
                assert read_all(client, url(name)) == data, name  # from the object store, but the blocked one

            # Over several rounds the others append far more than the backlog budget: nothing waits on
            # the blocked stream, whose own bytes stay counted.
            for round_ in range(4):
                for name in ("short", LONG, CJK):
                    chunk = f"{round_}:{name[:8]}|".encode() * 250
                    write(client, name, chunk)
                    written[name] += chunk
                wait_for(lambda: untiered(node) == stuck, what=f"round {round_} to tier")

            blocker.unlink()
            wait_for(lambda: untiered(node) == 0, timeout=45, what="the blocked stream to tier once unblocked")
            wait_for(lambda: tiering(node.url)["failing"] == [], what="the failure to clear")
            assert list((cold / "limits" / "blocked" / "segments").glob("*.parquet"))
            for name, data in written.items():
                assert read_all(client, url(name)) == data, name
        check_pipeline_finds_hashed_streams(cold, written)
    finally:
        node.stop()


def check_pipeline_finds_hashed_streams(cold: Path, written: dict[str, bytes]) -> None:
    """The data source plans from manifests: hashed directories are found, and named by their manifest."""
    from app.pipeline.planning import plan

    base = {"store": cold.as_uri(), "bucket": "limits", "include_hot": "false"}
    found = {p.stream for p in plan(base)}
    assert found == set(written)
    assert {p.stream for p in plan({**base, "prefix": "日本"})} == {CJK}
    assert {p.stream for p in plan({**base, "prefix": "long-"})} == {LONG}
    assert {p.stream for p in plan({**base, "stream": KIB})} == {KIB}
    total = sum(p.bytes for p in plan({**base, "stream": CJK}))
    assert total > 0


@pytest.fixture()
def moto() -> Iterator[MotoS3]:
    server = MotoS3("long-ids").start().create_bucket()
    yield server
    server.stop()


def s3_args(moto: MotoS3, prefix: str) -> tuple[str, ...]:
    return ("--cold-store", f"s3://{moto.bucket}/{prefix}", "--s3-endpoint-url", moto.endpoint_url)


def test_long_ids_tier_to_s3_and_a_long_store_prefix_refuses_them(tmp_path: Path, moto: MotoS3) -> None:
    node = RillProcess(tmp_path / "n", None, *s3_args(moto, "p"), *FAST, env={**AWS_ENV, **FAST_ENV}).start()
    try:
        with httpx.Client(base_url=node.url, timeout=10) as client:
            assert client.put("/ds/limits").status_code == 201
            written = {name: name.encode() * 7 for name in (LONG, CJK, KIB)}
            for name, data in written.items():
                write(client, name, data)
            wait_for(lambda: untiered(node) == 0 and tiering(node.url)["local_bytes"] == 0, what="tiering to S3")
            for name, data in written.items():
                prefix = f"p/limits/{keys.stream_component(name)}/"
                found = moto.keys(prefix)
                assert f"{prefix}manifest.json" in found and any(k.endswith(".parquet") for k in found)
                assert read_all(client, url(name)) == data
            assert tiering(node.url)["failing"] == []
    finally:
        node.stop()

    # A prefix this long leaves room for short names only: a long id is refused when it is created.
    prefix = "q" * (keys.S3_MAX_KEY_BYTES - max(len(k) for k in keys.longest_keys("limits", "short")) - 1)
    node = RillProcess(tmp_path / "m", None, *s3_args(moto, prefix), env=AWS_ENV).start()
    try:
        with httpx.Client(base_url=node.url, timeout=10) as client:
            assert client.put("/ds/limits").status_code == 201
            assert client.put(url("short"), headers=OCTET).status_code == 201
            refused = client.put(url(LONG), headers=OCTET)
            assert refused.status_code == 400
            error: dict[str, Any] = refused.json()["error"]
            assert error["code"] == "stream_id_too_long" and "1024" in error["message"]
            assert client.head(url(LONG)).status_code == 404
    finally:
        node.stop()
