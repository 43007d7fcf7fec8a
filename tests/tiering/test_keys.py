"""Object keys for any valid stream id: today's layout for short names, a hashed directory for long
ones, and the check that a store can hold a stream's keys at all."""

from __future__ import annotations

import errno
import hashlib
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.errors import ProtocolError
from app.domain.names import MAX_STREAM_ID_BYTES
from app.tiering import keys
from app.tiering import segment as seg
from app.tiering.store import FileStore, KeyRejected, S3Store, StoreOptions, StoreUnavailable

LONG_ASCII = "a" * 300
CJK = "日本語のストリーム名前" * 3  # 33 characters, 99 bytes of UTF-8, 297 percent-encoded
KIB = "k" * MAX_STREAM_ID_BYTES
KIB_CJK = "語" * (MAX_STREAM_ID_BYTES // 3)
OFFLINE = StoreOptions(endpoint_url="http://127.0.0.1:1", access_key_id="a", secret_access_key="b")


def test_short_names_keep_the_percent_encoded_layout() -> None:
    assert keys.stream_dir("b", "s") == "b/s"
    assert keys.stream_dir("b", "a/b") == "b/a%2Fb"
    assert keys.stream_dir("b", "日本") == "b/%E6%97%A5%E6%9C%AC"
    edge = "x" * keys.MAX_COMPONENT_BYTES
    assert keys.stream_dir("b", edge) == f"b/{edge}", "exactly at the limit is still encoded"


@pytest.mark.parametrize("name", [LONG_ASCII, CJK, KIB, KIB_CJK, "x" * (keys.MAX_COMPONENT_BYTES + 1), "%" * 70])
def test_long_names_get_a_hashed_directory(name: str) -> None:
    component = keys.stream_component(name)
    assert component == "!h-" + hashlib.sha256(name.encode()).hexdigest()
    assert keys.is_hashed(component) and keys.name_of(component) is None
    for key in keys.longest_keys("bucket-with-a-long-name-" + "z" * 40, name):
        parts = key.split("/")
        assert max(len(p.encode()) for p in parts) < 200
        assert len(key.encode()) < 400
    # The segment and manifest keys the worker writes sit in that directory.
    assert seg.segment_key("b", name, 0, 5).startswith(f"b/{component}/segments/")
    assert seg.manifest_key("b", name) == f"b/{component}/manifest.json"


def test_a_hashed_directory_cannot_be_a_percent_encoded_name() -> None:
    # The name that spells a hashed directory is itself short: it is percent-encoded, `!` included.
    lookalike = keys.stream_component(LONG_ASCII)
    assert keys.stream_component(lookalike) == "%21h-" + lookalike[3:]
    assert keys.stream_dir("b", lookalike) != keys.stream_dir("b", LONG_ASCII)
    assert keys.name_of(keys.stream_component(lookalike)) == lookalike


@given(st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=400))
def test_components_never_collide_nest_or_escape(name: str) -> None:
    component = keys.stream_component(name)
    assert "/" not in component and component not in (".", "..")
    assert len(component.encode()) <= keys.MAX_COMPONENT_BYTES
    if keys.is_hashed(component):
        assert len(quote(name, safe="-_.~")) > keys.MAX_COMPONENT_BYTES
    else:
        assert keys.name_of(component) == name and "!" not in component


@given(
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=300),
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=300),
)
def test_distinct_names_have_distinct_directories(a: str, b: str) -> None:
    if a != b:
        assert keys.stream_dir("b", a) != keys.stream_dir("b", b)


def test_parse_and_dir_of() -> None:
    hashed = keys.stream_component(CJK)
    segment = seg.segment_key("b", CJK, 12, 34)
    assert keys.parse(segment) == ("b", hashed, 12)
    assert keys.parse(seg.manifest_key("b", CJK)) == ("b", hashed, None)
    assert keys.dir_of(segment) == keys.dir_of(seg.manifest_key("b", CJK)) == f"b/{hashed}"
    assert keys.dir_of(f"b/{hashed}/snapshots/{'ab' * 32}.bin") == f"b/{hashed}"
    assert seg.parse_key(segment) is None, "only the manifest knows a hashed directory's name"
    assert seg.parse_key(seg.segment_key("b", "short", 12, 34)) == ("b", "short", 12)
    assert keys.parse("b/x/y/segments/0000000000000000_0000000000000001-x.parquet") is None


def test_manifest_candidates_include_the_pre_hashing_directory() -> None:
    assert keys.manifest_candidates("b", "s") == ["b/s/manifest.json"]
    legacy = f"b/{LONG_ASCII}/manifest.json"
    assert keys.manifest_candidates("b", LONG_ASCII) == [seg.manifest_key("b", LONG_ASCII), legacy]


# What a store can hold


def s3(prefix: str) -> S3Store:
    return S3Store("bkt", prefix, OFFLINE)  # no request is made: only the key length is checked


def test_s3_limit_counts_the_store_prefix() -> None:
    longest = max(len(k.encode()) for k in keys.longest_keys("b", LONG_ASCII))
    room = keys.S3_MAX_KEY_BYTES - longest - 1  # the prefix and its "/" take the rest
    keys.check_storable(s3("p" * room), "b", LONG_ASCII)
    with pytest.raises(ProtocolError) as caught:
        keys.check_storable(s3("p" * (room + 1)), "b", LONG_ASCII)
    assert (caught.value.status, caught.value.code) == (400, "stream_id_too_long")
    assert "1025 bytes" in caught.value.message
    keys.check_storable(s3("p" * (room + 1)), "b", "s")  # a short name still fits
    keys.check_storable(s3(""), "b", KIB_CJK)


def test_file_limits_per_component_and_for_the_whole_path(tmp_path: Path) -> None:
    for name in (LONG_ASCII, CJK, KIB, KIB_CJK):
        keys.check_storable(FileStore(tmp_path), "b", name)
    assert keys.key_problem(FileStore(tmp_path), "b/" + "c" * 256 + "/manifest.json") is not None, "255 per name"
    extra = len("/") + len("..4294967295.tmp") + 1
    short = max(len(k) for k in keys.longest_keys("b", "s"))
    root = "/" + "d" * (keys.FILE_MAX_PATH_BYTES - extra - short - 2)  # never created: only its length counts
    keys.check_storable(FileStore(root), "b", "s")
    with pytest.raises(ProtocolError) as caught:
        keys.check_storable(FileStore(root), "b", LONG_ASCII)
    assert caught.value.code == "stream_id_too_long"


def test_no_store_and_unknown_stores_are_not_checked() -> None:
    keys.check_storable(None, "b", KIB)


# How the file store reports a key it cannot hold


def test_file_store_rejects_one_key_without_calling_it_an_outage(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.put("b/ok/x", b"1")
    (tmp_path / "b" / "blocked").write_bytes(b"a file where a directory must go")
    with pytest.raises(KeyRejected) as caught:
        store.put("b/blocked/segments/x", b"1")
    assert isinstance(caught.value, StoreUnavailable) and "Not a directory" in str(caught.value)
    with pytest.raises(KeyRejected, match="too long"):
        store.put("b/" + "n" * 300 + "/x", b"1")
    # A path that cannot exist holds no object: reads miss, deletes succeed.
    assert store.stat("b/blocked/segments/x") is None and store.stat("b/" + "n" * 300 + "/x") is None
    with pytest.raises(KeyError):
        store.get("b/blocked/segments/x")
    store.delete("b/blocked/segments/x")
    store.delete("b/" + "n" * 300 + "/x")
    assert store.get("b/ok/x") == b"1"


def test_file_store_full_disk_is_an_outage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStore(tmp_path)

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "mkdir", full)
    with pytest.raises(StoreUnavailable) as caught:
        store.put("b/s/x", b"1")
    assert not isinstance(caught.value, KeyRejected)


@pytest.mark.parametrize(
    ("code", "status", "per_key"),
    [
        ("KeyTooLongError", 400, True),
        ("AccessDenied", 403, True),
        ("InternalError", 500, False),
        ("SlowDown", 503, False),
    ],
)
def test_s3_errors_about_one_key_are_told_from_outages(code: str, status: int, per_key: bool) -> None:
    from botocore.stub import Stubber

    store = s3("p")
    with Stubber(store.client) as stub:
        stub.add_client_error("put_object", service_error_code=code, http_status_code=status)
        with pytest.raises(StoreUnavailable) as caught:
            store.put("b/s/manifest.json", b"{}")
    assert isinstance(caught.value, KeyRejected) is per_key and code in str(caught.value)
