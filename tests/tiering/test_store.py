"""The object store contract, run against FileStore (a temp dir) and S3Store (moto's S3 server over HTTP)."""

from __future__ import annotations

import hashlib
import os
import random
import time
import uuid
from pathlib import Path

import pytest

from app.tiering.store import (
    FileStore,
    ObjectInfo,
    ObjectStore,
    S3Store,
    StoreOptions,
    StoreUnavailable,
    open_store,
    sha256_hex,
)
from tests.moto import MotoS3
from tests.server import free_port


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "file":
        return FileStore(tmp_path / "cold")
    moto: MotoS3 = request.getfixturevalue("moto_s3")
    return moto.store()


def seed(store: ObjectStore, keys: list[str], data: bytes = b"x") -> None:
    """Many small objects, fast: written the way each store lays them out, bypassing the slow path.

    FileStore.put fsyncs every object and every put to moto is a signed HTTP request; what is under
    test here is listing, so files are written directly and objects go straight into moto's backend.
    """
    if isinstance(store, FileStore):
        for key in keys:
            path = store.root / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return
    assert isinstance(store, S3Store)
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    for key in keys:
        backend.put_object(store.bucket, f"{store.prefix}/{key}", data)


# Objects


@pytest.mark.parametrize(
    "data",
    [b"", bytes(range(256)), b"\x00" * 17, random.Random(7).randbytes(5_000_000)],
    ids=["empty", "all-bytes", "zeros", "5MB"],
)
def test_put_get_round_trip(store: ObjectStore, data: bytes) -> None:
    store.put("b/s/segments/obj.parquet", data)
    assert store.get("b/s/segments/obj.parquet") == data
    assert store.stat("b/s/segments/obj.parquet") == ObjectInfo(len(data), sha256_hex(data))


def test_overwrite_replaces_the_object(store: ObjectStore) -> None:
    store.put("k", b"first version")
    store.put("k", b"second")
    assert store.get("k") == b"second"
    assert store.stat("k") == ObjectInfo(6, sha256_hex(b"second"))
    assert list(store.list("")) == ["k"]


def test_get_missing_is_a_key_error(store: ObjectStore) -> None:
    with pytest.raises(KeyError):
        store.get("missing")
    with pytest.raises(KeyError):
        store.get("no/such/dir/obj")
    assert store.stat("missing") is None
    assert store.stat("no/such/dir/obj") is None


def test_delete_is_idempotent(store: ObjectStore) -> None:
    store.delete("never/existed")
    store.put("d/obj", b"x")
    store.put("d/other", b"y")
    store.delete("d/obj")
    with pytest.raises(KeyError):
        store.get("d/obj")
    assert store.stat("d/obj") is None
    store.delete("d/obj")
    assert list(store.list("")) == ["d/other"]
    assert store.get("d/other") == b"y"


def test_list_by_prefix_in_key_order(store: ObjectStore) -> None:
    keys = ["p/x-1", "p/x/1", "p/x/2/deep", "p/x0", "p/X", "p/\u00fc", "p/z", "q/x", "px"]
    for key in random.Random(3).sample(keys, len(keys)):
        store.put(key, key.encode())
    assert list(store.list("")) == sorted(keys)
    assert list(store.list("p/")) == sorted(k for k in keys if k.startswith("p/"))
    assert list(store.list("p/x")) == ["p/x-1", "p/x/1", "p/x/2/deep", "p/x0"]
    assert list(store.list("p/x/")) == ["p/x/1", "p/x/2/deep"]
    assert list(store.list("p")) == sorted(k for k in keys if k.startswith("p"))
    assert list(store.list("nothing/")) == []
    assert list(store.list("p/y")) == []


def test_list_pages_through_more_than_a_thousand_keys(store: ObjectStore) -> None:
    keys = [f"many/{i:05d}.parquet" for i in range(1005)]
    seed(store, keys[:-2])
    store.put(keys[-2], b"put")
    store.put(keys[-1], b"put")
    store.put("other/0", b"not listed")
    listed = list(store.list("many/"))
    assert listed == keys, f"{len(listed)} keys listed"
    assert list(store.list("many/0100")) == keys[1000:]
    assert store.get(keys[500]) == b"x"


@pytest.mark.parametrize(
    "key",
    ["b/nested%2Fbeta/segments/0-1.parquet", "b/with space/manifest.json", "b/%2E%2E/x", "b/\u00fc %25+&=/y"],
)
def test_keys_with_escapes_and_spaces_are_taken_literally(store: ObjectStore, key: str) -> None:
    store.put(key, b"payload")
    assert store.get(key) == b"payload"
    assert store.stat(key) == ObjectInfo(7, sha256_hex(b"payload"))
    assert list(store.list("b/")) == [key]
    prefix = key.rsplit("/", 1)[0] + "/"
    assert list(store.list(prefix)) == [key]
    unescaped = key.replace("%2F", "/").replace("%2E", ".").replace("%25", "%")
    if unescaped != key:
        with pytest.raises((KeyError, ValueError)):
            store.get(unescaped)
    store.delete(key)
    assert list(store.list("")) == []


# S3 specifics


def test_s3_prefix_isolates_stores(moto_s3: MotoS3) -> None:
    base = f"iso-{uuid.uuid4().hex[:8]}"
    one = open_store(f"s3://{moto_s3.bucket}/{base}", moto_s3.options)
    other = open_store(f"s3://{moto_s3.bucket}/{base}-x", moto_s3.options)
    nested = open_store(f"s3://{moto_s3.bucket}/{base}/deeper/", moto_s3.options)
    one.put("k", b"one")
    other.put("k", b"other")
    nested.put("k", b"nested")
    assert (one.get("k"), other.get("k"), nested.get("k")) == (b"one", b"other", b"nested")
    assert list(other.list("")) == ["k"]
    assert list(nested.list("")) == ["k"]
    assert list(one.list("")) == ["deeper/k", "k"], "a store's keys are everything under its prefix"
    raw = moto_s3.client().list_objects_v2(Bucket=moto_s3.bucket, Prefix=base)
    assert sorted(o["Key"] for o in raw["Contents"]) == [f"{base}-x/k", f"{base}/deeper/k", f"{base}/k"]
    other.delete("k")
    assert one.get("k") == b"one"


def test_s3_records_the_sha256_and_stat_tolerates_foreign_objects(moto_s3: MotoS3) -> None:
    store = moto_s3.store()
    store.put("mine", b"data")
    head = moto_s3.client().head_object(Bucket=moto_s3.bucket, Key=f"{store.prefix}/mine")
    assert head["Metadata"]["sha256"] == sha256_hex(b"data")
    moto_s3.client().put_object(Bucket=moto_s3.bucket, Key=f"{store.prefix}/foreign", Body=b"abc")
    assert store.stat("foreign") == ObjectInfo(3, None)
    assert store.get("foreign") == b"abc"


def test_s3_missing_bucket_is_an_outage_not_a_missing_key(moto_s3: MotoS3) -> None:
    store = S3Store("no-such-bucket-here", "p", moto_s3.options)
    with pytest.raises(StoreUnavailable):
        store.get("k")
    with pytest.raises(StoreUnavailable):
        store.put("k", b"x")
    with pytest.raises(StoreUnavailable):
        list(store.list(""))


def _fast_fail(endpoint: str) -> StoreOptions:
    return StoreOptions(
        endpoint_url=endpoint,
        access_key_id="test",
        secret_access_key="test",
        region="us-east-1",
        connect_timeout=0.5,
        read_timeout=1.0,
    )


def test_s3_endpoint_down_raises_store_unavailable() -> None:
    store = S3Store("bucket", "p", _fast_fail(f"http://127.0.0.1:{free_port()}"))  # nothing listens there
    started = time.monotonic()
    for call in (
        lambda: store.get("k"),
        lambda: store.put("k", b"x"),
        lambda: store.stat("k"),
        lambda: store.delete("k"),
        lambda: list(store.list("")),
    ):
        with pytest.raises(StoreUnavailable):
            call()
    assert time.monotonic() - started < 15, "small timeouts keep an outage quick to detect"


def test_s3_outage_and_recovery(moto_s3: MotoS3) -> None:
    second = MotoS3(moto_s3.bucket).start()
    store = S3Store(moto_s3.bucket, f"outage-{uuid.uuid4().hex[:8]}", _fast_fail(second.endpoint_url))
    store.put("k", b"before")
    second.stop()
    try:
        with pytest.raises(StoreUnavailable):
            store.get("k")
        with pytest.raises(StoreUnavailable):
            store.stat("k")
        with pytest.raises(StoreUnavailable):
            list(store.list(""))
    finally:
        second.start()
    try:
        assert store.get("k") == b"before", "the same client works again once the endpoint is back"
    finally:
        second.stop()


# FileStore specifics


@pytest.mark.parametrize("key", ["../escape", "a/../../escape", "ABSOLUTE", "..", "a/../.."])
def test_file_store_rejects_keys_outside_its_root(tmp_path: Path, key: str) -> None:
    if key == "ABSOLUTE":
        key = str(tmp_path / "escape")
    store = FileStore(tmp_path / "root")
    with pytest.raises(ValueError):
        store.put(key, b"x")
    with pytest.raises(ValueError):
        store.get(key)
    with pytest.raises(ValueError):
        store.stat(key)
    with pytest.raises(ValueError):
        store.delete(key)
    assert {p.name for p in tmp_path.iterdir()} <= {"root"}, "nothing was written outside the root"


def test_file_store_rejects_listing_outside_its_root(tmp_path: Path) -> None:
    (tmp_path / "outside").write_bytes(b"secret")
    store = FileStore(tmp_path / "root")
    with pytest.raises(ValueError):
        list(store.list("../"))


def test_file_store_lists_nothing_before_its_root_exists(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "not-yet")
    assert list(store.list("")) == [] and list(store.list("a/")) == []
    with pytest.raises(KeyError):
        store.get("a")


def test_file_store_delete_removes_emptied_directories(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = FileStore(root)
    store.put("a/b/c/obj", b"1")
    store.put("a/keep", b"2")
    store.delete("a/b/c/obj")
    assert not (root / "a" / "b").exists()
    assert (root / "a" / "keep").is_file()
    store.delete("a/keep")
    assert not (root / "a").exists()
    assert root.is_dir() and list(root.iterdir()) == [], "the root itself stays"
    store.delete("x/y/z")  # missing, in missing directories
    assert root.is_dir()


def test_file_store_put_leaves_no_temporary_files_and_list_skips_them(tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = FileStore(root)
    store.put("s/segments/a.parquet", b"data")
    assert sorted(p.name for p in (root / "s" / "segments").iterdir()) == ["a.parquet"]
    (root / "s" / "segments" / ".b.parquet.123.tmp").write_bytes(b"half")  # a crash mid-put
    assert list(store.list("")) == ["s/segments/a.parquet"]


def test_file_store_on_an_unusable_root_raises_store_unavailable(tmp_path: Path) -> None:
    root = tmp_path / "a-file"
    root.write_bytes(b"not a directory")
    store = FileStore(root)
    with pytest.raises(StoreUnavailable):
        store.put("k", b"x")
    with pytest.raises(StoreUnavailable):
        store.get("k")
    with pytest.raises(StoreUnavailable):
        store.stat("k")


# open_store


def test_open_store_s3_urls() -> None:
    opts = StoreOptions(endpoint_url="http://127.0.0.1:1", access_key_id="a", secret_access_key="b")
    store = open_store("s3://bkt/some/prefix/", opts)
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix, store.url) == ("bkt", "some/prefix", "s3://bkt/some/prefix")
    bare = open_store("s3://bkt", opts)
    assert isinstance(bare, S3Store)
    assert (bare.bucket, bare.prefix, bare.url) == ("bkt", "", "s3://bkt")
    escaped = open_store("s3://bkt/with%20space", opts)
    assert isinstance(escaped, S3Store) and escaped.prefix == "with space"


def test_open_store_file_urls_and_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(f"file://{tmp_path}/cold")
    assert isinstance(store, FileStore) and store.root == tmp_path.resolve() / "cold"
    assert store.url == (tmp_path.resolve() / "cold").as_uri()
    spaced = open_store(f"file://{tmp_path}/with%20space")
    assert isinstance(spaced, FileStore) and spaced.root == tmp_path.resolve() / "with space"
    bare = open_store(str(tmp_path / "bare"))
    assert isinstance(bare, FileStore) and bare.root == tmp_path.resolve() / "bare"
    monkeypatch.chdir(tmp_path)
    relative = open_store("data/cold")
    assert isinstance(relative, FileStore) and relative.root == tmp_path.resolve() / "data" / "cold"
    relative.put("k", b"v")
    assert (tmp_path / "data" / "cold" / "k").read_bytes() == b"v"


@pytest.mark.parametrize("url", ["http://host/dir", "gs://bucket/p", "ftp://x", "S4://b/p"])
def test_open_store_rejects_unknown_schemes(url: str) -> None:
    with pytest.raises(ValueError, match="unsupported store URL"):
        open_store(url)


@pytest.mark.parametrize("url", ["s3://", "s3:///prefix", "s3:"])
def test_open_store_s3_needs_a_bucket(url: str) -> None:
    with pytest.raises(ValueError, match="needs a bucket"):
        open_store(url)


def test_open_store_over_moto_writes_under_the_prefix(moto_s3: MotoS3) -> None:
    prefix = f"open-{uuid.uuid4().hex[:8]}/nested"
    store = open_store(f"s3://{moto_s3.bucket}/{prefix}", moto_s3.options)
    store.put("b/s/manifest.json", b"{}")
    body = moto_s3.client().get_object(Bucket=moto_s3.bucket, Key=f"{prefix}/b/s/manifest.json")["Body"].read()
    assert body == b"{}"
    assert list(store.list("b/")) == ["b/s/manifest.json"]


def test_put_file_streams_a_large_file_and_records_its_digest(store: ObjectStore, tmp_path: Path) -> None:
    data = os.urandom(9 << 20)  # past boto3's multipart threshold (8 MiB): sent in parts on S3
    source = tmp_path / "big.bin"
    source.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    store.put_file("backups/big.state", source, digest)
    assert store.get("backups/big.state") == data
    info = store.stat("backups/big.state")
    assert info is not None and info.size == len(data) and info.sha256 == digest


def test_get_range_reads_part_of_an_object(store: ObjectStore) -> None:
    store.put("r/obj", b"0123456789")
    assert store.get_range("r/obj", 2, 5) == b"234"
    assert store.get_range("r/obj", 8, 100) == b"89"  # cut at the end
    assert store.get_range("r/obj", 4, 4) == b""
    with pytest.raises(KeyError):
        store.get_range("r/missing", 0, 4)


def test_file_store_a_failed_put_leaves_no_temporary_file(tmp_path: Path) -> None:
    """A full disk fails the write: its half must not stay, one more per retry."""
    store = FileStore(tmp_path)

    def fail(fh: object) -> None:
        raise OSError(28, "No space left on device")

    for _ in range(3):
        with pytest.raises(StoreUnavailable):
            store._write("b/s/segments/x.parquet", fail)
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == []


def test_file_store_stat_reads_the_digest_of_what_it_holds(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    data = os.urandom(3 << 20)  # more than one read's piece
    store.put("k", data)
    assert store.stat("k") == ObjectInfo(len(data), hashlib.sha256(data).hexdigest())
    assert store.stat("missing") is None
