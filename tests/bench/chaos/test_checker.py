"""The chaos checker on made-up histories: a clean one passes, and each kind of wrong answer is named."""

from __future__ import annotations

from app.bench.chaos.checker import check
from app.bench.chaos.history import Ack, Append, Claim, Fault, History, Read


def off(position: int) -> str:
    return f"{position:016d}"  # offsets sort as their positions do


def clean() -> History:
    """Two appends to s, both acknowledged, read back by a catch-up reader and an SSE reader on node 2."""
    h = History(seed=7, nodes=3, final_leader=1)
    h.appends = [
        Append("w0", 1, "s", "w0.0", 0.0, 0.1, "ok", 204, off(5)),
        Append("w0", 2, "s", "w0.1", 0.2, 0.3, "ok", 204, off(10)),
        Append("p0", 3, "s", "p0.0", 0.35, 0.4, "unknown", 503, "", "p0", 0),
        Append("p0", 1, "s", "p0.0", 0.45, 0.5, "ok", 204, off(15), "p0", 0),
    ]
    h.reads = [
        Read("c0", 2, "s", "catch-up", 0.31, 0.32, "-1", off(10), 10, True, ["w0.0", "w0.1"]),
        Read("c0", 3, "s", "catch-up", 0.6, 0.61, off(10), off(15), 15, True, ["p0.0"]),
        Read("sse0", 2, "s", "sse", 0.0, 0.2, "-1", off(5), 5, True, ["w0.0"]),
    ]
    h.final = {n: {"s": ["w0.0", "w0.1", "p0.0"]} for n in (1, 2, 3)}
    h.claims = [
        Claim("k0", 1, 0.0, 0.1, 200, 1, "w_a", {"s": off(0)}),
        Claim("k1", 2, 0.5, 0.6, 200, 2, "w_b", {"s": off(10)}),
    ]
    h.acks = [Ack("k0", 1, 0.2, 0.3, 200, 1, {"s": off(10)})]
    h.subscription_final = {"s": off(10)}
    h.faults = [Fault("kill", "sigkill node 1", 0.0, 0.3)]
    return h


def kinds(h: History) -> list[str]:
    return [v.kind for v in check(h).violations]


def test_a_clean_history_passes() -> None:
    verdict = check(clean())
    assert verdict.ok, verdict.violations
    assert (verdict.acknowledged, verdict.lost, verdict.duplicated) == (3, 0, 0)


def test_the_history_survives_json() -> None:
    h = clean()
    assert History.from_json(h.to_json()) == h


def test_an_acknowledged_append_missing_everywhere_is_lost() -> None:
    h = clean()
    h.final = {n: {"s": ["w0.0", "p0.0"]} for n in (1, 2, 3)}
    verdict = check(h)
    assert verdict.lost == 1
    assert "lost" in kinds(h)
    lost = next(v for v in verdict.violations if v.kind == "lost")
    assert lost.excerpt[0]["payload"] == "w0.1"


def test_a_node_that_holds_other_content_diverged_and_the_leader_is_the_reference() -> None:
    h = clean()
    h.final[2] = {"s": ["w0.0", "p0.0"]}
    assert kinds(h) == ["diverged"]
    h.final_leader = 2  # now the others hold an append the leader lost
    assert "lost" in kinds(h)


def test_a_payload_stored_twice_is_duplicated() -> None:
    h = clean()
    h.final = {n: {"s": ["w0.0", "w0.1", "p0.0", "p0.0"]} for n in (1, 2, 3)}
    assert check(h).duplicated == 1


def test_bytes_no_client_sent_and_refused_appends_that_were_stored_are_phantoms() -> None:
    h = clean()
    h.final = {n: {"s": ["w0.0", "w0.1", "p0.0", "junk"]} for n in (1, 2, 3)}
    assert "phantom" in kinds(h)
    h = clean()
    h.appends.append(Append("w1", 1, "s", "w1.0", 0.7, 0.8, "refused", 400))
    h.final = {n: {"s": ["w0.0", "w0.1", "p0.0", "w1.0"]} for n in (1, 2, 3)}
    assert "phantom" in kinds(h)


def test_an_append_acknowledged_before_another_was_sent_must_come_first() -> None:
    h = clean()
    h.final = {n: {"s": ["w0.1", "w0.0", "p0.0"]} for n in (1, 2, 3)}
    assert "order" in kinds(h)


def test_concurrent_appends_may_land_in_either_order() -> None:
    h = clean()
    h.appends[1] = Append("w0", 2, "s", "w0.1", 0.05, 0.3, "ok", 204, off(5))  # sent before w0.0's answer
    h.appends[0] = Append("w0", 1, "s", "w0.0", 0.0, 0.1, "ok", 204, off(10))
    h.final = {n: {"s": ["w0.1", "w0.0", "p0.0"]} for n in (1, 2, 3)}
    h.reads = []
    assert check(h).ok, check(h).violations


def test_one_offset_naming_two_positions_is_caught() -> None:
    h = clean()
    h.reads.append(Read("c1", 1, "s", "catch-up", 0.9, 0.95, "-1", off(10), 5, False, ["w0.0"]))
    assert "offsets" in kinds(h)


def test_offsets_that_shrink_as_positions_grow_are_caught() -> None:
    h = clean()
    h.appends[1] = Append("w0", 2, "s", "w0.1", 0.2, 0.3, "ok", 204, off(1))
    assert "offsets" in kinds(h)


def test_an_up_to_date_read_missing_an_acknowledged_append_is_stale() -> None:
    h = clean()
    h.reads.append(Read("c1", 3, "s", "catch-up", 0.35, 0.36, "-1", off(5), 5, True, ["w0.0"]))
    verdict = check(h)
    assert verdict.stale_reads == 1
    stale = next(v for v in verdict.violations if v.kind == "stale-read")
    assert [op["op"] for op in stale.excerpt] == ["append", "read"]


def test_a_read_of_bytes_that_were_never_committed_is_caught() -> None:
    h = clean()
    h.appends.append(Append("w1", 1, "s", "w1.0", 0.7, 0.8, "unknown", 503))
    h.reads.append(Read("c1", 3, "s", "catch-up", 0.7, 0.75, "-1", off(20), 20, False, ["w0.0", "w0.1", "w1.0"]))
    assert check(h).uncommitted_reads == 1


def test_a_reader_sent_back_to_an_earlier_position_is_caught() -> None:
    h = clean()
    h.reads.append(Read("c0", 1, "s", "long-poll", 0.7, 0.75, off(15), off(10), 10, False, []))
    assert check(h).backwards_reads == 1


def test_one_generation_granted_twice_is_caught() -> None:
    h = clean()
    h.claims.append(Claim("k2", 3, 0.7, 0.8, 200, 2, "w_c", {"s": off(10)}))
    assert "subscription" in kinds(h)


def test_an_ack_accepted_after_a_newer_generation_was_granted_is_caught() -> None:
    h = clean()
    h.acks.append(Ack("k0", 1, 0.7, 0.8, 200, 1, {"s": off(15)}))
    assert "subscription" in kinds(h)


def test_an_acknowledged_offset_that_moves_back_is_caught() -> None:
    h = clean()
    h.claims[1] = Claim("k1", 2, 0.5, 0.6, 200, 2, "w_b", {"s": off(5)})
    assert "subscription" in kinds(h)
    h = clean()
    h.subscription_final = {"s": off(5)}
    assert "subscription" in kinds(h)


def test_writes_refused_long_after_a_heal_are_unavailability() -> None:
    h = clean()
    h.appends.append(Append("w1", 1, "s", "w1.0", 30.0, 30.5, "ok", 204, off(20)))
    h.faults.append(Fault("partition", "isolate", 1.0, 2.0))
    h.final = {n: {"s": ["w0.0", "w0.1", "p0.0", "w1.0"]} for n in (1, 2, 3)}
    verdict = check(h, bound=15)
    assert [v.kind for v in verdict.violations] == ["unavailable"]
    assert verdict.worst_unavailable == 28.5
    assert check(h, bound=30).ok


def test_a_fault_never_healed_is_reported() -> None:
    h = clean()
    h.faults.append(Fault("pause", "stop node 2", 1.0))
    assert "unavailable" in kinds(h)
