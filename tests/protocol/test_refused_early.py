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
