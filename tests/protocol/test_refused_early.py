"""A write the applied state already refuses is answered without a log entry: every replica would
store, sync and apply it (a refused append's body included), and a client could repeat it forever."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.inprocess import running_node

pytestmark = pytest.mark.anyio

TEXT = {"content-type": "text/plain"}
BIG = b"x" * (1 << 20)


async def test_refused_writes_make_no_log_entry(tmp_path: Path) -> None:
    async with running_node(tmp_path) as node:
        kv, _ = node.stores["raft"]

        def entries() -> int:
            return sum(1 for _ in kv.scan("log", b""))

        transport = httpx.ASGITransport(node.app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://rill.test") as c:
            assert (await c.put("/ds/bkt-one")).status_code == 201
            assert (await c.put("/ds/bkt-one/s", headers=TEXT)).status_code == 201
            assert (await c.put("/ds/bkt-one/done", headers={**TEXT, "stream-closed": "true"})).status_code == 201
            producer = {**TEXT, "producer-id": "p", "producer-epoch": "1", "producer-seq": "0"}
            assert (await c.post("/ds/bkt-one/s", headers=producer, content=b"a")).status_code == 200
            refused = [
                (c.post("/ds/bkt-one/missing", headers=TEXT, content=BIG), 404),
                (c.post("/ds/bkt-one/done", headers=TEXT, content=BIG), 409),
                (c.post("/ds/bkt-one/s", headers={"content-type": "application/json"}, content=b"[1]"), 409),
                (c.post("/ds/bkt-one/s", headers={**producer, "producer-seq": "5"}, content=b"b"), 409),  # a gap
                (c.post("/ds/bkt-one/s", headers={**producer, "producer-epoch": "0"}, content=b"b"), 403),  # stale
                (c.delete("/ds/bkt-one/missing"), 404),
                (c.put("/ds/bkt-one/s", headers={**TEXT, "stream-ttl": "60"}), 409),
                (c.put("/ds/bkt-one/fork", headers={"stream-forked-from": "missing"}), 404),
                (c.post("/ds/bkt-one/done/append-batch", headers=TEXT, content=b"\x00\x00\x00\x01a"), 200),
            ]
            for request, status in refused:
                before = entries()
                response = await request
                assert response.status_code == status, response.text
                assert entries() == before, f"{response.request.method} {response.request.url} made a log entry"
            closed = (await c.post("/ds/bkt-one/done/append-batch", headers=TEXT, content=b"\x00\x00\x00\x01a")).json()
            assert [frame["error"] for frame in closed] == ["stream_closed"]
            # What is accepted still goes through the log.
            before = entries()
            assert (await c.post("/ds/bkt-one/s", headers=TEXT, content=b"c")).status_code == 204
            assert (await c.post("/ds/bkt-one/done", headers={**TEXT, "stream-closed": "true"})).status_code == 204
            assert entries() == before + 2


async def test_refused_snapshots_and_retention_make_no_log_entry_and_upload_nothing(tmp_path: Path) -> None:
    async with running_node(tmp_path) as node:
        kv, _ = node.stores["raft"]

        def entries() -> int:
            return sum(1 for _ in kv.scan("log", b""))

        def uploaded() -> list[Path]:
            return [p for p in (tmp_path / "cold").rglob("*.bin")]

        transport = httpx.ASGITransport(node.app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://rill.test") as c:
            s = "/ds/bkt-two/s"
            assert (await c.put("/ds/bkt-two")).status_code == 201
            assert (await c.put(s, headers=TEXT)).status_code == 201
            first = (await c.post(s, headers=TEXT, content=b"abc")).headers["stream-next-offset"]
            tail = (await c.post(s, headers=TEXT, content=b"def")).headers["stream-next-offset"]
            assert (await c.put(f"{s}/snapshot/{tail}", content=b"state")).status_code == 201
            past = "0" * 16 + "_" + "9" * 16
            inside = first[:-1] + chr(ord(first[-1]) - 1)  # a position inside the first record
            large = b"L" * (300 * 1024)  # past the inline size: uploaded to the object store
            refused = [
                (c.put(f"{s}/snapshot/{past}", content=b"x" * 200_000), 409),
                (c.put(f"{s}/snapshot/{past}", content=large), 409),
                (c.put(f"{s}/snapshot/{inside}", content=large), 400),
                (c.put(f"{s}/snapshot/{tail}", content=large), 409),  # another snapshot stands there
                (c.put(f"{s}/snapshot/{first}", headers={"stream-snapshot-match": "sha256:00"}, content=large), 409),
                (c.delete(f"{s}/snapshot/{first}"), 404),
                (c.delete(f"{s}/snapshot/{tail}"), 409),  # the latest
                (c.put(f"{s}/retention/{past}"), 409),
                (c.put(f"{s}/retention/{inside}"), 400),
            ]
            for request, status in refused:
                before = entries()
                response = await request
                assert response.status_code == status, response.text
                assert entries() == before, f"{response.request.method} {response.request.url} made a log entry"
            assert uploaded() == []
            # What is accepted still goes through the log.
            before = entries()
            assert (await c.put(f"{s}/snapshot/{tail}", content=b"state")).status_code == 204  # the same again
            assert (await c.put(f"{s}/snapshot/{first}", content=large)).status_code == 201
            assert (await c.put(f"{s}/retention/{first}")).status_code == 204
            assert entries() == before + 3 and len(uploaded()) == 1
