"""`rill append` (DATA, stdin lines, --raw, --producer) and `rill read` against a real server."""

from __future__ import annotations

import json
import random

import httpx
import pytest

from tests.cli.conftest import invoke, run
from tests.server import RillProcess

Capture = pytest.CaptureFixture[bytes]


@pytest.fixture(scope="module")
def bucket(server: RillProcess) -> str:
    assert httpx.put(server.url + "/ds/appends").status_code == 201
    return server.url + "/ds/appends"


def _create(url: str, content_type: str) -> str:
    assert httpx.put(url, headers={"content-type": content_type}).status_code == 201
    return url


def _tail(url: str) -> str:
    return httpx.head(url).headers["stream-next-offset"]


def test_json_stdin_lines_become_messages(bucket: str) -> None:
    url = _create(bucket + "/json-lines", "application/json")
    messages = [{"n": i, "text": "é" * (i % 7), "list": [i, None, True]} for i in range(2500)]
    stdin = "\n".join(json.dumps(m) for m in messages[:1200]) + "\n\n  \n"  # blank lines are skipped
    stdin += "\n".join(json.dumps(m, indent=None, separators=(", ", ": ")) for m in messages[1200:])  # no final \n
    done = run("append", url, "-", "--producer", "loader", stdin=stdin.encode())
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().strip() == _tail(url)  # the new tail, alone on stdout
    read = run("read", url)
    assert read.returncode == 0, read.stderr
    assert [json.loads(line) for line in read.stdout.splitlines()] == messages
    assert read.stdout.decode() == "".join(  # each message's own text, without its spaces
        json.dumps(m, separators=(",", ":")) + "\n" for m in messages
    )
    # 2,500 lines went as three POSTs of at most 1,000 (seqs 0, 1, 2): the producer's next seq is 3.
    gap = run("append", url, '{"late": true}', "--producer", "loader", "--seq", "5")
    assert gap.returncode == 1 and b"expects --seq 3" in gap.stderr, gap.stderr
    assert run("append", url, '{"late": true}', "--producer", "loader", "--seq", "3").returncode == 0


def test_json_messages_are_printed_as_their_own_text(bucket: str) -> None:
    """Numbers as written (1.10, 1e400, 0.1000000000000000055511151231257827), not as Python reads
    them (1.1, Infinity, 0.1); spaces outside strings dropped, so each message is one line."""
    url = _create(bucket + "/json-exact", "application/json")
    sent = '{"a": 1.10, "b": 1e400, "c": 0.1000000000000000055511151231257827}\n{"s": "x  y\\" z", "e": "\\u00e9"}\n'
    assert run("append", url, "-", stdin=sent.encode()).returncode == 0
    read = run("read", url)
    assert read.returncode == 0, read.stderr
    assert read.stdout.decode() == (
        '{"a":1.10,"b":1e400,"c":0.1000000000000000055511151231257827}\n{"s":"x  y\\" z","e":"\\u00e9"}\n'
    )


def test_a_line_that_is_not_json_stops_with_its_number(bucket: str, capsysbinary: Capture) -> None:
    url = _create(bucket + "/json-bad", "application/json")
    code, _, err = invoke(capsysbinary, "append", url, stdin=b'{"ok": 1}\n{"broken": \n')
    assert code == 1 and err.startswith("rill: error: stdin line 2 is not JSON")


@pytest.mark.parametrize("line", [b"NaN", b'{"x": Infinity}', b"-Infinity"])
def test_a_value_only_python_takes_stops_with_its_line_number(bucket: str, capsysbinary: Capture, line: bytes) -> None:
    # Python's parser takes NaN and Infinity; the server does not, and refused the whole batch of up
    # to 1,000 lines with no line number.
    url = _create(f"{bucket}/json-nan-{len(line)}", "application/json")
    code, _, err = invoke(capsysbinary, "append", url, stdin=b'{"ok": 1}\n' + line + b"\n")
    assert code == 1 and err.startswith("rill: error: stdin line 2 is not JSON"), err
    assert invoke(capsysbinary, "read", url)[1] == b""  # nothing of the batch was sent


def test_producer_retry_is_deduplicated(bucket: str, capsysbinary: Capture) -> None:
    url = _create(bucket + "/idempotent", "application/json")
    stdin = b'{"order": 1}\n{"order": 2}\n{"order": 3}\n'
    first = invoke(capsysbinary, "append", url, "--producer", "shop-1", stdin=stdin)
    again = invoke(capsysbinary, "append", url, "--producer", "shop-1", stdin=stdin)  # a retry of the same
    assert first[0] == again[0] == 0, again
    assert first[1] == again[1]  # the tail the producer's appends made, echoed
    assert "repeated" in again[2] and "repeated" not in first[2]
    assert invoke(capsysbinary, "read", url)[1] == b'{"order":1}\n{"order":2}\n{"order":3}\n'  # written once
    # A new epoch fences the old one: the old writer gets a clear refusal.
    assert invoke(capsysbinary, "append", url, '{"order": 4}', "--producer", "shop-1", "--epoch", "1")[0] == 0
    code, _, err = invoke(capsysbinary, "append", url, '{"order": 5}', "--producer", "shop-1", "--seq", "9")
    assert code == 1 and err.startswith("rill: error: producer shop-1 is fenced: the stream is at its epoch 1")
    code, _, err = invoke(capsysbinary, "append", url, "5", "--producer", "shop-1", "--epoch", "2", "--seq", "1")
    assert code == 1 and "must start at --seq 0" in err


def test_text_stdin_is_one_append_per_line(bucket: str, capsysbinary: Capture) -> None:
    url = _create(bucket + "/text-lines", "text/plain; charset=utf-8")
    stdin = b"first line\n\nthird \xc3\xa9\nno newline at the end"
    code, _, err = invoke(capsysbinary, "append", url, "--producer", "lines", stdin=stdin)
    assert code == 0, err
    assert invoke(capsysbinary, "read", url)[1] == stdin
    # Four lines, four appends (seqs 0 to 3).
    assert invoke(capsysbinary, "append", url, "more\n", "--producer", "lines", "--seq", "4")[0] == 0


def test_raw_stdin_is_one_append_and_binary_reads_back_exactly(bucket: str) -> None:
    url = _create(bucket + "/binary", "application/octet-stream")
    data = random.Random(7).randbytes(300_000) + bytes(range(256)) + b"\r\n\n\x00"
    done = run("append", url, "--raw", "--producer", "raw", stdin=data)
    assert done.returncode == 0, done.stderr
    read = run("read", url)  # the server reads 4 KiB chunks here: many requests
    assert read.returncode == 0 and read.stdout == data
    assert run("append", url, "x", "--producer", "raw", "--seq", "1").returncode == 0  # one append: seq 0


def test_data_argument_and_read_from_an_offset(
    bucket: str, capsysbinary: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _create(bucket + "/args", "text/plain")
    code, out, _ = invoke(capsysbinary, "append", url, "hello ")
    middle = out.decode().strip()
    assert code == 0 and middle == _tail(url)
    invoke(capsysbinary, "append", url, "world")
    assert invoke(capsysbinary, "read", url)[1] == b"hello world"
    assert invoke(capsysbinary, "read", url, "--from", middle)[1] == b"world"
    assert invoke(capsysbinary, "read", url, "--from", "now")[1] == b""
    monkeypatch.setenv("RILL_URL", bucket.rsplit("/ds/", 1)[0])
    assert invoke(capsysbinary, "read", "appends/args")[1] == b"hello world"  # BUCKET/STREAM


def test_empty_stdin_appends_nothing_and_prints_the_tail(bucket: str, capsysbinary: Capture) -> None:
    url = _create(bucket + "/empty", "application/json")
    code, out, _ = invoke(capsysbinary, "append", url, stdin=b"\n")
    assert code == 0 and out.decode().strip() == _tail(url) == "0000000000000000_0000000000000000"
    assert invoke(capsysbinary, "read", url)[1] == b""


def test_appending_to_a_closed_stream_fails_cleanly(bucket: str, capsysbinary: Capture) -> None:
    url = _create(bucket + "/closed", "text/plain")
    assert httpx.post(url, headers={"stream-closed": "true"}).status_code == 204
    code, out, err = invoke(capsysbinary, "append", url, "late")
    assert code == 1 and out == b"" and "closed" in err
