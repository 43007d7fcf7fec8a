"""Snapshots, bootstrap and retention on real processes: across a leader change, across tiering,
and automatic retention by size and by age."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.server import RillCluster, RillProcess
from tests.tiering.test_cold_tier import FREQUENT_BACKUPS, SMALL_SEGMENTS, all_tiered, wait_for

OCTET = {"content-type": "application/octet-stream"}


def parts(response: httpx.Response) -> list[bytes]:
    """The bodies of a multipart/mixed response, in order."""
    boundary = response.headers["content-type"].split("boundary=", 1)[1]
    body = response.content
    assert body.endswith(f"--{boundary}--\r\n".encode())
    out = []
    for chunk in body.split(f"--{boundary}".encode())[1:-1]:
        head, _, rest = chunk.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.startswith(b"content-length")))
        out.append(rest[:length])
    return out


def test_a_snapshot_published_just_before_failover_is_served_after_it(tmp_path: Path) -> None:
    # The nodes share one cold store (large snapshot blobs live there), as a cluster must.
    cluster = RillCluster(tmp_path, 3, "--no-forward-writes", "--cold-store", (tmp_path / "cold").as_uri()).start()
    try:
        leader_id = cluster.wait_for_leader()
        leader = cluster.nodes[leader_id]
        with httpx.Client(base_url=leader.url, timeout=10) as client:
            assert client.put("/ds/fail").status_code == 201
            assert client.put("/ds/fail/s", headers=OCTET).status_code == 201
            tails = []
            for i in range(10):
                r = client.post("/ds/fail/s", content=b"m%d;" % i, headers=OCTET)
                tails.append(r.headers["stream-next-offset"])
            big = bytes(range(256)) * 2048  # 512 KiB: kept in the object store, not inline
            r = client.put(
                f"/ds/fail/s/snapshot/{tails[4]}", content=b"state@5", headers={"content-type": "text/plain"}
            )
            assert r.status_code == 201
            r = client.put(f"/ds/fail/s/snapshot/{tails[7]}", content=big)
            assert r.status_code == 201
        leader.kill()  # acknowledged means committed on a majority: the next leader has both

        new_leader = cluster.wait_for_leader()
        assert new_leader != leader_id
        survivor = next(n for i, n in cluster.nodes.items() if i not in (leader_id, new_leader))
        with httpx.Client(timeout=10, follow_redirects=True) as client:
            for node in (cluster.nodes[new_leader], survivor):
                r = client.get(f"{node.url}/ds/fail/s/snapshot/{tails[4]}")
                assert (r.status_code, r.content, r.headers["content-type"]) == (200, b"state@5", "text/plain")
                latest = client.get(f"{node.url}/ds/fail/s/snapshot", follow_redirects=False)
                assert latest.status_code == 307 and latest.headers["location"].endswith(tails[7])
                boot = client.get(f"{node.url}/ds/fail/s/bootstrap")
                assert boot.status_code == 200, boot.text
                assert boot.headers["stream-snapshot-offset"] == tails[7]
                assert parts(boot) == [big, b"m8;", b"m9;"]
    finally:
        cluster.stop()


def test_bootstrap_after_the_tail_went_to_the_cold_tier_returns_the_same_bytes(tmp_path: Path) -> None:
    node = RillProcess(tmp_path / "n", None, *SMALL_SEGMENTS, env=FREQUENT_BACKUPS).start()
    try:
        with httpx.Client(base_url=node.url, timeout=10) as client:
            assert client.put("/ds/boot").status_code == 201
            assert client.put("/ds/boot/j", headers={"content-type": "application/json"}).status_code == 201
            offsets = []
            for i in range(60):
                r = client.post("/ds/boot/j", json=[{"i": i, "k": k, "pad": "z" * 50} for k in range(2)])
                offsets.append(r.headers["stream-next-offset"])
            assert client.put(f"/ds/boot/j/snapshot/{offsets[49]}", content=b'{"upto":50}').status_code == 201
            before = client.get("/ds/boot/j/bootstrap")
            wait_for(lambda: all_tiered(node.url), what="tiering")
            after = client.get("/ds/boot/j/bootstrap")
            assert after.status_code == 200
            assert parts(after) == parts(before) and len(parts(after)) == 1 + 10 * 2
            assert after.headers["stream-next-offset"] == offsets[-1]
            assert after.headers["stream-up-to-date"] == "true"
            # Retention up to the snapshot also takes the cold segments below it; bootstrap is unchanged.
            segments = tmp_path / "n" / "cold" / "boot" / "j" / "segments"
            cut = int(offsets[49][-16:])

            def below_cut() -> list[Path]:
                return [p for p in segments.glob("*.parquet") if int(p.stem.split("-")[1][-16:]) <= cut]

            assert below_cut()
            assert client.put(f"/ds/boot/j/retention/{offsets[49]}").status_code == 204
            assert parts(client.get("/ds/boot/j/bootstrap")) == parts(before)
            assert client.get("/ds/boot/j", params={"offset": offsets[3]}).status_code == 410
            wait_for(lambda: not below_cut(), what="segments below the retention point to be deleted")
            assert list(segments.glob("*.parquet")), "segments at and after it stay"
    finally:
        node.stop()


def test_automatic_retention_by_size_and_by_bucket_default_age(tmp_path: Path) -> None:
    node = RillProcess(tmp_path / "n", None, "--segment-max-age", "3600").start()
    try:
        with httpx.Client(base_url=node.url, timeout=10) as client:
            assert client.put("/ds/sized").status_code == 201
            headers = {**OCTET, "stream-retention": "max-bytes=1000"}
            assert client.put("/ds/sized/s", headers=headers).status_code == 201
            for _ in range(50):
                assert client.post("/ds/sized/s", content=b"x" * 100, headers=OCTET).status_code == 204

            def earliest() -> int:
                return int(client.head("/ds/sized/s").headers["stream-earliest-offset"][-16:])

            wait_for(lambda: earliest() >= 4000, what="size-based retention")
            assert earliest() == 4000 and len(client.get("/ds/sized/s", params={"offset": "-1"}).content) == 1000

            # A snapshot holds retention back: history after it stays.
            snap = "0000000000000000_0000000000004500"
            assert client.put(f"/ds/sized/s/snapshot/{snap}", content=b"s").status_code == 201
            for _ in range(20):
                client.post("/ds/sized/s", content=b"y" * 100, headers=OCTET)
            time.sleep(2)
            assert earliest() == 4500

            assert client.put("/ds/aged", headers={"stream-retention": "max-age=1"}).status_code == 201
            assert client.put("/ds/aged/s", headers=OCTET).status_code == 201  # inherits max-age=1
            for _ in range(5):
                client.post("/ds/aged/s", content=b"old;", headers=OCTET)
            time.sleep(1.5)
            r = client.post("/ds/aged/s", content=b"new;", headers=OCTET)
            wait_for(
                lambda: (
                    client.head("/ds/aged/s").headers["stream-earliest-offset"] == "0000000000000000_0000000000000020"
                ),
                what="age-based retention",
            )
            assert client.get("/ds/aged/s", params={"offset": "-1"}).content == b"new;"
            assert r.headers["stream-next-offset"].endswith("24")
    finally:
        node.stop()


def test_a_large_tail_is_bounded_and_the_client_reads_on_from_next_offset(tmp_path: Path) -> None:
    node = RillProcess(tmp_path / "n", None, env={"RILL_BOOTSTRAP_MAX_BYTES": "2048"}).start()
    try:
        with httpx.Client(base_url=node.url, timeout=10) as client:
            assert client.put("/ds/bound").status_code == 201
            assert client.put("/ds/bound/s", headers=OCTET).status_code == 201
            messages = [b"%03d:" % i + b"x" * 295 for i in range(20)]  # 300 bytes each, 6,000 in all
            for m in messages:
                client.post("/ds/bound/s", content=m, headers=OCTET)
            boot = client.get("/ds/bound/s/bootstrap")
            got = parts(boot)[1:]
            # Parts of about 420 bytes with their heads: four fit in 2,048, with the (empty) snapshot's
            # part and the closing boundary on top.
            assert got == messages[:4] and len(boot.content) <= 2048 + 200
            assert "stream-up-to-date" not in boot.headers
            rest = client.get("/ds/bound/s", params={"offset": boot.headers["stream-next-offset"]})
            assert rest.content == b"".join(messages[len(got) :])
    finally:
        node.stop()
