"""Bytes in stream ids and headers on a real server, in every route family: control characters and
invalid UTF-8 are a 400 (never a stream, never a 500, never a line in the log), valid UTF-8 works.

httpx percent-encodes what it sends, so the bytes it would refuse or rewrite go over a raw socket.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.http.helpers import FAMILIES, TEXT, assert_error, family_base, uid
from tests.server import RillProcess

FORGED = "FORGED-LOG-LINE"
# Percent-encoded control characters: C0 (with CR/LF and TAB), DEL and C1 (as UTF-8).
CONTROL = ["%00", "%01", "%09", "%0A", "%0D", "%0D%0A", "%1B", "%1F", "%7F", "%C2%80", "%C2%85", "%C2%9F"]
# Not UTF-8 once decoded: a lone byte, a cut sequence, an overlong "/", a surrogate, past U+10FFFF.
NOT_UTF8 = ["%FF", "%E9", "%C3", "%E6%97", "%C0%AF", "%ED%A0%80", "%F4%90%80%80"]
VALID = [
    pytest.param("\u65e5\u672c\u8a9e", id="cjk"),
    pytest.param("\U0001f600\U0001f30a", id="emoji"),
    pytest.param("caf\u00e9", id="latin1"),
    pytest.param("nbsp\u00a0x", id="u00a0"),  # the first character after the C1 range
    pytest.param("repl\ufffd", id="ufffd"),  # sent as valid UTF-8, it is an ordinary character
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RillProcess]:
    """A server of its own, with the access log on, so its log holds only these tests' requests."""
    rill = RillProcess(tmp_path_factory.mktemp("idbytes") / "data", None, "--access-log").start()
    yield rill
    rill.stop()


@pytest.fixture(scope="module")
def client(server: RillProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


@pytest.fixture(scope="module")
def ds_bucket(client: httpx.Client) -> str:
    name = "bytes-" + uid()
    assert client.put(f"/ds/{name}").status_code == 201
    return name


@pytest.fixture(params=FAMILIES)
def base(request: pytest.FixtureRequest, ds_bucket: str) -> str:
    return family_base(request.param, ds_bucket)


def raw_request(port: int, method: str, target: bytes, headers: dict[bytes, bytes] | None = None) -> tuple[int, bytes]:
    """Sends one request with exactly these bytes; returns the status and the body."""
    head = method.encode() + b" " + target + b" HTTP/1.1\r\n"
    fields = {b"host": b"127.0.0.1", b"content-length": b"0", b"connection": b"close", **(headers or {})}
    head += b"".join(b"%s: %s\r\n" % item for item in fields.items())
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + b"\r\n")
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    status_line, _, rest = response.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def assert_not_created(client: httpx.Client, base: str, u: str) -> None:
    """Nothing exists under the test's fresh prefix (the /ds listing), and its plain neighbour is 404."""
    assert_error(client.get(f"{base}{u}"), 404)
    if base.startswith("/ds/"):
        bucket = base.split("/")[2]
        assert client.get(f"/ds/{bucket}", params={"prefix": u}).json()["streams"] == []


# ------------------------------------------------------------------------------------------------
# Control characters


@pytest.mark.parametrize("char", CONTROL)
def test_control_characters_in_ids_are_400_on_every_method(client: httpx.Client, base: str, char: str) -> None:
    u = uid()
    for suffix in (f"{u}{char}", f"{u}/a{char}b", f"{char}{u}"):
        for method in ("PUT", "POST", "GET", "DELETE"):
            resp = client.request(method, base + suffix, headers=TEXT, content=b"x" if method == "POST" else b"")
            err = assert_error(resp, 400)
            assert err["code"] == "invalid_stream_id", (method, suffix, err)
            assert "control character" in err["message"], err
        head = client.head(base + suffix)
        assert head.status_code == 400 and head.content == b""
    assert_not_created(client, base, u)


@pytest.mark.parametrize("char", ["%0A", "%0D%0A"])
def test_control_characters_in_ds_sub_resource_paths_are_400(client: httpx.Client, ds_bucket: str, char: str) -> None:
    u = uid()
    assert client.put(f"/ds/{ds_bucket}/{u}", headers=TEXT).status_code == 201
    for sub in ("attrs", "bootstrap", "snapshot"):
        err = assert_error(client.get(f"/ds/{ds_bucket}/{u}{char}/{sub}"), 400)
        assert err["code"] == "invalid_stream_id", err


@pytest.mark.parametrize("char", [b"\r\n", b"\n", b"\x01", b"\x7f", b"\t"])
def test_raw_control_bytes_in_the_request_line_are_400(server: RillProcess, base: str, char: bytes) -> None:
    """The HTTP parser refuses them before the app sees the request (its own plain-text 400)."""
    u = uid()
    status, _ = raw_request(server.port, "PUT", f"{base}{u}".encode() + char + FORGED.encode() + b"-x")
    assert status == 400


def test_forged_log_lines_are_impossible(server: RillProcess, client: httpx.Client, base: str) -> None:
    u = uid()
    injected = f"%0D%0A{FORGED}%20{u}%0D%0A"
    for target in (f"{base}{u}{injected}", f"{base}{u}/x{injected}y", f"{base}{injected}"):
        status, body = raw_request(server.port, "PUT", target.encode())
        assert status == 400 and b'"invalid_stream_id"' in body
    # And through a header that names a stream.
    assert client.put(f"{base}{u}", headers=TEXT).status_code == 201
    fork = client.put(f"{base}{u}-fork", headers={"stream-forked-from": f"{base}{u}{injected}"})
    assert assert_error(fork, 400)["code"] == "invalid_stream_id"
    assert_error(client.get(f"{base}{u}-fork"), 404)
    lines = Path(server.log_path).read_text(errors="replace").splitlines()
    assert not [line for line in lines if line.startswith(FORGED) or re.match(rf"\s*{FORGED}", line)]
    assert any(u in line for line in lines), "the access log is on: the requests were logged"


# ------------------------------------------------------------------------------------------------
# Invalid UTF-8


@pytest.mark.parametrize("seq", NOT_UTF8)
def test_invalid_utf8_in_ids_is_400_and_not_a_replacement_character(client: httpx.Client, base: str, seq: str) -> None:
    u = uid()
    for method in ("PUT", "POST", "GET", "DELETE"):
        resp = client.request(method, f"{base}{u}/a{seq}b", headers=TEXT, content=b"x" if method == "POST" else b"")
        err = assert_error(resp, 400)
        assert (err["code"], err["message"]) == (
            "invalid_stream_id",
            "the request path is not valid UTF-8 once percent-decoded",
        ), method
    # Servers decode it leniently to U+FFFD: that would be another, valid, id.
    assert_error(client.get(f"{base}{u}/a%EF%BF%BDb"), 404)
    assert_not_created(client, base, u)


def test_invalid_utf8_in_a_ds_bucket_id_is_a_bad_bucket_id(client: httpx.Client) -> None:
    for path in ("/ds/bad%FFbucket", "/ds/bad%FFbucket/s"):
        assert assert_error(client.put(path, headers=TEXT), 400)["code"] == "invalid_bucket_id"


def test_invalid_utf8_in_stream_attrs_is_400_and_creates_nothing(server: RillProcess, base: str) -> None:
    u = uid()
    for attrs in (b'{"title":"\xe9"}', b'{"metadata":{"\xff":1}}', b'{"title":"\xed\xa0\x80"}'):
        status, body = raw_request(server.port, "PUT", f"{base}{u}".encode(), {b"stream-attrs": attrs})
        assert status == 400 and b'"invalid_attrs"' in body, body
    with httpx.Client(base_url=server.url, timeout=10) as client:
        assert_not_created(client, base, u)


def test_invalid_utf8_in_a_fork_reference_is_400(client: httpx.Client, base: str) -> None:
    u = uid()
    assert client.put(f"{base}{u}", headers=TEXT, content=b"src").status_code == 201
    fork = client.put(f"{base}{u}-fork", headers={"stream-forked-from": f"{base}{u}%FF"})
    assert assert_error(fork, 400)["code"] == "invalid_stream_id"
    assert_error(client.get(f"{base}{u}-fork"), 404)


# ------------------------------------------------------------------------------------------------
# Valid UTF-8


@pytest.mark.parametrize("name", VALID)
def test_valid_utf8_ids_work(client: httpx.Client, base: str, name: str) -> None:
    u = uid()
    path = f"{base}{u}/{name}"
    created = client.put(path, headers=TEXT, content=b"u")
    assert created.status_code == 201, created.text
    location = created.headers["location"]
    assert location.isascii() and location.endswith(created.request.url.raw_path.decode()), location
    assert client.post(path, headers=TEXT, content=b"2").status_code == 204
    assert client.get(path, params={"offset": "-1"}).content == b"u2"
    # The Location names the stream, as a fork reference too.
    assert client.put(f"{base}{u}-fork", headers={"stream-forked-from": location}).status_code == 201
    assert client.get(f"{base}{u}-fork", params={"offset": "-1"}).content == b"u2"
    if base.startswith("/ds/"):
        bucket = base.split("/")[2]
        listed = client.get(f"/ds/{bucket}", params={"prefix": f"{u}/"}).json()["streams"]
        assert [s["name"] for s in listed] == [f"{u}/{name}"]
    assert client.delete(path).status_code == 204


def test_utf8_stream_attrs_are_kept(server: RillProcess, client: httpx.Client, ds_bucket: str) -> None:
    u = uid()
    attrs = '{"title":"\u65e5\u672c \U0001f600"}'.encode()
    status, body = raw_request(server.port, "PUT", f"/ds/{ds_bucket}/{u}".encode(), {b"stream-attrs": attrs})
    assert status == 201, body
    assert client.get(f"/ds/{ds_bucket}/{u}/attrs").json() == {"title": "\u65e5\u672c \U0001f600"}


def test_invalid_utf8_in_an_attrs_body_is_400_and_changes_nothing(client: httpx.Client, ds_bucket: str) -> None:
    path = f"/ds/{ds_bucket}/{uid()}"
    assert client.put(path, headers={**TEXT, "stream-attrs": '{"title":"t"}'}).status_code == 201
    for body in (b'{"title":"\xe9"}', b'{"metadata":{"k":"\xc3"}}'):
        resp = client.put(f"{path}/attrs", headers={"content-type": "application/json"}, content=body)
        assert assert_error(resp, 400)["code"] == "invalid_attrs"
    assert client.get(f"{path}/attrs").json() == {"title": "t"}
