"""Object keys of a stream's cold-tier objects, and whether a store can hold them.

A stream's objects live in one directory, `{bucket}/{component}/`: segments, `manifest.json` and
snapshots. The component is the percent-encoded name while that stays short (today's layout, so
existing keys keep their place); a longer name gets `!h-{sha256 of the name}` instead, which fits
every store (file systems allow 255 bytes per path component, S3 1,024 per key) whatever the id.
Percent-encoding never yields `!`, so a hashed component cannot equal an encoded one. The real name
of a hashed directory is in its `manifest.json`.
"""

from __future__ import annotations

import hashlib
from urllib.parse import quote, unquote

from app.domain.errors import ProtocolError
from app.domain.offsets import format_offset
from app.tiering.store import FileStore, ObjectStore, S3Store

HASHED = "!h-"
MAX_COMPONENT_BYTES = 200  # leaves room under 255 for the file store's temporary names
S3_MAX_KEY_BYTES = 1024
FILE_MAX_NAME_BYTES = 255
FILE_MAX_PATH_BYTES = 4096  # PATH_MAX, the terminating NUL included
_TMP_EXTRA = len("..4294967295.tmp")  # FileStore.put writes `.{name}.{pid}.tmp` first


def encoded_component(stream: str) -> str:
    """The percent-encoded name, the directory name of every stream before long names were hashed."""
    name = quote(stream, safe="-_.~")
    return name.replace(".", "%2E") if set(name) <= {"."} else name


def stream_component(stream: str) -> str:
    """The directory name of a stream's objects: percent-encoded, or hashed when that would be too long."""
    name = encoded_component(stream)
    if len(name) > MAX_COMPONENT_BYTES:
        return HASHED + hashlib.sha256(stream.encode()).hexdigest()
    return name


def is_hashed(component: str) -> bool:
    return component.startswith(HASHED)


def name_of(component: str) -> str | None:
    """The stream a directory name stands for; None for a hashed one (its manifest has the name)."""
    return None if is_hashed(component) else unquote(component)


def stream_dir(bucket: str, stream: str) -> str:
    """The key prefix of a stream's objects. No name's directory can nest in, or equal, another's."""
    return f"{bucket}/{stream_component(stream)}"


def manifest_candidates(bucket: str, stream: str) -> list[str]:
    """Where a stream's manifest may be: its directory, and for a long name also the percent-encoded
    one it had before hashing (the tiering worker keeps a stream beside its existing segments)."""
    keys = [f"{stream_dir(bucket, stream)}/manifest.json"]
    legacy = f"{bucket}/{encoded_component(stream)}/manifest.json"
    return keys if legacy == keys[0] else [*keys, legacy]


def dir_of(key: str) -> str:
    """The stream directory a segment, snapshot or manifest key sits in."""
    for marker in ("/segments/", "/snapshots/"):
        if marker in key:
            return key.rpartition(marker)[0]
    return key.removesuffix("/manifest.json")


def split_dir(directory: str) -> tuple[str, str] | None:
    """(bucket, component) of a stream directory."""
    bucket, sep, component = directory.partition("/")
    return (bucket, component) if sep and bucket and component and "/" not in component else None


def parse(key: str) -> tuple[str, str, int | None] | None:
    """(bucket, component, first position) of a segment key, or (bucket, component, None) of a manifest key."""
    if key.endswith("/manifest.json"):
        directory, lo = key.removesuffix("/manifest.json"), None
    elif "/segments/" in key:
        directory, _, name = key.rpartition("/segments/")
        try:
            lo = int(name.split("-", 1)[0][-16:])  # the first offset token's position digits
        except ValueError:
            return None
    else:
        return None
    parts = split_dir(directory)
    return None if parts is None else (*parts, lo)


def longest_keys(bucket: str, stream: str) -> list[str]:
    """The longest key of each kind a stream can have (offsets and digests are fixed width)."""
    directory = stream_dir(bucket, stream)
    offset = format_offset(0)
    return [
        f"{directory}/segments/{offset}-{offset}.parquet",
        f"{directory}/snapshots/{'0' * 64}.bin",
        f"{directory}/manifest.json",
    ]


def key_problem(store: ObjectStore, key: str) -> str | None:
    """Why `store` cannot hold `key`, or None when it can (or the store is not one whose limits are known)."""
    if isinstance(store, S3Store):
        full = len((f"{store.prefix}/{key}" if store.prefix else key).encode())
        if full > S3_MAX_KEY_BYTES:
            return f"its object keys would be {full} bytes with the store's prefix; S3 allows {S3_MAX_KEY_BYTES}"
        return None
    if isinstance(store, FileStore):
        parts = [p.encode() for p in key.split("/")]
        longest = max(len(p) for p in parts[:-1] + [parts[-1] + b"x" * _TMP_EXTRA])
        if longest > FILE_MAX_NAME_BYTES:
            return f"a path component would be {longest} bytes; the file system allows {FILE_MAX_NAME_BYTES}"
        path = len(bytes(store.root)) + 1 + len(key.encode()) + _TMP_EXTRA + 1
        if path > FILE_MAX_PATH_BYTES:
            return f"its file paths would be {path} bytes; the limit is {FILE_MAX_PATH_BYTES}"
    return None


def check_storable(store: ObjectStore | None, bucket: str, stream: str) -> None:
    """Raises 400 stream_id_too_long when the object store could not hold this stream's objects."""
    if store is None:
        return
    for key in longest_keys(bucket, stream):
        problem = key_problem(store, key)
        if problem is not None:
            raise ProtocolError(400, "stream_id_too_long", f"stream id is too long for the object store: {problem}")
