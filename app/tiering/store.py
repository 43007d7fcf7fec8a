"""Object stores for the cold tier: `s3://bucket/prefix` (boto3, any S3 endpoint) and `file:///dir`.

Keys are relative to the store's root (the URL's prefix or directory). Every method is
blocking; the server calls them from worker threads. A store that cannot be reached raises
`StoreUnavailable`, so callers can tell an outage from a missing object; one that refuses a single
key (its name is too long, something else sits at its path, access to it is denied) raises the
subclass `KeyRejected`, so the tiering worker can set that stream aside and go on with the others.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol
from urllib.parse import unquote, urlsplit

from app.domain.errors import ProtocolError


class StoreUnavailable(Exception):
    """The object store could not be reached or refused the request; retry later."""


class KeyRejected(StoreUnavailable):
    """The store refused this one key; others may be fine (an outage is a plain StoreUnavailable)."""


def stops_a_pass(exc: BaseException) -> bool:
    """Whether a failure of one stream's store work is everyone's (the store is down, or leadership
    changed), so the pass waits; any other failure sets only that stream aside."""
    return isinstance(exc, StoreUnavailable) and not isinstance(exc, KeyRejected) or isinstance(exc, ProtocolError)


# Errors about one path, not the whole directory (ENOSPC, EIO, EROFS... are about all of it).
_KEY_ERRNOS = frozenset(
    {errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ELOOP, errno.EACCES, errno.EPERM,
     errno.EINVAL, errno.EILSEQ}
)  # fmt: skip
# A path that cannot exist (too long, or through a regular file) holds no object.
_NO_SUCH_PATH = frozenset({errno.ENOTDIR, errno.ENAMETOOLONG})
# S3 error codes about one key or its permissions; any other code is treated as an outage.
_KEY_CODES = frozenset({"KeyTooLongError", "AccessDenied", "403", "InvalidArgument", "InvalidObjectState"})


@dataclass(frozen=True)
class StoreOptions:
    """How to reach an S3 endpoint; unset values fall back to boto3's usual sources (AWS_* env, config)."""

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    path_style: bool | None = None  # None: path style when an endpoint URL is given (MinIO, moto)
    connect_timeout: float = 3.0
    read_timeout: float = 20.0


@dataclass(frozen=True)
class ObjectInfo:
    size: int
    sha256: str | None  # as recorded at upload; None if the object carries none


class ObjectStore(Protocol):
    url: str

    def put(self, key: str, data: bytes | memoryview) -> None:
        """Writes the whole object atomically, recording its SHA-256."""
        ...

    def put_file(self, key: str, path: Path, sha256: str) -> None:
        """Writes the file at `path` as the object, streamed (in parts where the store has them)."""
        ...

    def get(self, key: str) -> bytes:
        """The whole object; KeyError if it does not exist."""
        ...

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of the object (fewer at its end); KeyError if it does not exist."""
        ...

    def stat(self, key: str) -> ObjectInfo | None: ...

    def delete(self, key: str) -> None:
        """Removes the object; removing a missing one is not an error."""
        ...

    def list(self, prefix: str) -> Iterator[str]:
        """Keys starting with `prefix`, in key order."""
        ...


def sha256_hex(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


class FileStore:
    """A directory as an object store: the embedded default (`./data/cold`)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self.url = self.root.as_uri()

    def _usable(self, mode: int) -> bool:
        return os.path.isdir(self.root) and os.access(self.root, mode | os.X_OK)

    def _error(self, exc: OSError, mode: int = os.R_OK) -> StoreUnavailable:
        """KeyRejected for an error about the key's own path; an unusable root is an outage."""
        if exc.errno in _KEY_ERRNOS and self._usable(mode):
            return KeyRejected(str(exc))
        return StoreUnavailable(str(exc))

    def _missing(self, exc: OSError) -> bool:
        return isinstance(exc, FileNotFoundError) or (exc.errno in _NO_SUCH_PATH and self._usable(os.R_OK))

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root):
            raise ValueError(f"key escapes the store: {key!r}")
        return path

    def put(self, key: str, data: bytes | memoryview) -> None:
        self._write(key, lambda fh: fh.write(data))

    def put_file(self, key: str, path: Path, sha256: str) -> None:
        def copy(fh: BinaryIO) -> None:
            with open(path, "rb") as source:
                shutil.copyfileobj(source, fh, 1 << 20)

        self._write(key, copy)

    def _write(self, key: str, fill: Callable[[BinaryIO], object]) -> None:
        path = self._path(key)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                with open(tmp, "wb") as fh:
                    fill(fh)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)  # a full disk must not fill up further with halves
                raise
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise self._error(exc, os.W_OK) from exc

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except OSError as exc:
            if self._missing(exc):
                raise KeyError(key) from None
            raise self._error(exc) from exc

    def get_range(self, key: str, start: int, end: int) -> bytes:
        try:
            with self._path(key).open("rb") as file:
                file.seek(start)
                return file.read(max(0, end - start))
        except OSError as exc:
            if self._missing(exc):
                raise KeyError(key) from None
            raise self._error(exc) from exc

    def stat(self, key: str) -> ObjectInfo | None:
        # A directory keeps no metadata, so the digest is recomputed: a real read-back check, read a
        # piece at a time (a state backup may be larger than the memory to spare).
        digest, size = hashlib.sha256(), 0
        try:
            with open(self._path(key), "rb") as fh:
                while piece := fh.read(1 << 20):
                    digest.update(piece)
                    size += len(piece)
        except OSError as exc:
            if self._missing(exc):
                return None
            raise self._error(exc) from exc
        return ObjectInfo(size, digest.hexdigest())

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except OSError as exc:
            if not self._missing(exc):
                raise self._error(exc, os.W_OK) from exc
        # Drop directories the removal left empty, up to the root.
        parent = path.parent
        while parent != self.root:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def list(self, prefix: str) -> Iterator[str]:
        base = self._path(prefix.rsplit("/", 1)[0]) if "/" in prefix else self.root
        if not base.is_dir():
            return
        keys = sorted(
            p.relative_to(self.root).as_posix() for p in base.rglob("*") if p.is_file() and not p.name.startswith(".")
        )
        yield from (k for k in keys if k.startswith(prefix))


class S3Store:
    """`s3://bucket/prefix` through boto3: AWS S3, MinIO or moto's server."""

    def __init__(self, bucket: str, prefix: str, options: StoreOptions) -> None:
        import boto3
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        path_style = options.path_style if options.path_style is not None else bool(options.endpoint_url)
        config = Config(
            s3={"addressing_style": "path" if path_style else "auto"},
            connect_timeout=options.connect_timeout,
            read_timeout=options.read_timeout,
            retries={"max_attempts": 2, "mode": "standard"},
            max_pool_connections=16,
        )
        self.client = boto3.session.Session().client(
            "s3",
            endpoint_url=options.endpoint_url,
            region_name=options.region or os.environ.get("AWS_REGION") or "us-east-1",
            aws_access_key_id=options.access_key_id,
            aws_secret_access_key=options.secret_access_key,
            aws_session_token=options.session_token,
            config=config,
        )

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, method: str, **kwargs: object) -> dict:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, method)(Bucket=self.bucket, **kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise KeyError(kwargs.get("Key")) from None
            raise (KeyRejected if code in _KEY_CODES else StoreUnavailable)(f"{method}: {code or exc}") from exc
        except BotoCoreError as exc:
            raise StoreUnavailable(f"{method}: {exc}") from exc

    def put(self, key: str, data: bytes | memoryview) -> None:
        # Content-MD5 makes the store reject a body damaged in transit; the SHA-256 is kept for readers.
        md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
        body = data if isinstance(data, bytes) else bytes(data)  # botocore takes bytes or files, not views
        self._call("put_object", Key=self._key(key), Body=body, ContentMD5=md5, Metadata={"sha256": sha256_hex(data)})

    def get(self, key: str) -> bytes:
        body = self._call("get_object", Key=self._key(key))["Body"]
        try:
            return body.read()
        except Exception as exc:  # a connection dropped mid-body
            raise StoreUnavailable(f"get_object: {exc}") from exc

    def put_file(self, key: str, path: Path, sha256: str) -> None:
        # boto3's transfer manager sends a large file in parts (several at once) and checksums each.
        from boto3.exceptions import S3UploadFailedError

        try:
            self.client.upload_file(str(path), self.bucket, self._key(key), ExtraArgs={"Metadata": {"sha256": sha256}})
        except S3UploadFailedError as exc:
            raise StoreUnavailable(f"upload_file: {exc}") from exc
        except Exception as exc:
            if type(exc).__module__.startswith("botocore"):
                raise StoreUnavailable(f"upload_file: {exc}") from exc
            raise

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        body = self._call("get_object", Key=self._key(key), Range=f"bytes={start}-{end - 1}")["Body"]
        try:
            return body.read()
        except Exception as exc:
            raise StoreUnavailable(f"get_object: {exc}") from exc

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            head = self._call("head_object", Key=self._key(key))
        except KeyError:
            return None
        return ObjectInfo(int(head["ContentLength"]), head.get("Metadata", {}).get("sha256"))

    def delete(self, key: str) -> None:
        self._call("delete_object", Key=self._key(key))

    def list(self, prefix: str) -> Iterator[str]:
        token: dict[str, str] = {}
        cut = len(self.prefix) + 1 if self.prefix else 0
        while True:
            page = self._call("list_objects_v2", Prefix=self._key(prefix), **token)
            for item in page.get("Contents", []):
                yield item["Key"][cut:]
            if not page.get("IsTruncated"):
                return
            token = {"ContinuationToken": page["NextContinuationToken"]}


def open_store(url: str, options: StoreOptions | None = None) -> ObjectStore:
    """The store a URL names: `s3://bucket/prefix` or `file:///absolute/dir` (a bare path works too)."""
    parts = urlsplit(url)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ValueError(f"an S3 store URL needs a bucket: {url!r}")
        return S3Store(parts.netloc, unquote(parts.path), options or StoreOptions())
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"a file store URL needs an absolute path, file:///dir: {url!r}")
        return FileStore(unquote(parts.path))
    if parts.scheme == "":
        return FileStore(url)
    raise ValueError(f"unsupported store URL {url!r}: use s3://bucket/prefix or file:///dir")
