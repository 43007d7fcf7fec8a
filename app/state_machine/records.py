"""What the state machine stores, and how it is keyed in the KV."""

from __future__ import annotations

import struct

import msgspec

from app.storage.kv import Buffer, Parts

# Column families of the state machine store.
BUCKETS = "buckets"  # bucket name -> created_at (u64 ms)
NAMES = "names"  # bucket \0 stream -> sid (u64)
STREAMS = "streams"  # sid -> StreamMeta
DATA = "data"  # sid, position -> record
PRODUCERS = "producers"  # sid, producer id -> ProducerState
SM_META = "sm_meta"  # applied index, next sid
SEGMENTS = "segments"  # sid, first position -> SegmentInfo (tiered to the object store)
GC_QUEUE = "gc_queue"  # object key -> b"": objects to delete from the object store
STREAM_SNAPSHOTS = "stream_snapshots"  # sid, position -> PublishedSnapshot (applications' snapshots)
SUBSCRIPTIONS = "subscriptions"  # bucket \0 root \0 id -> Subscription
PACKS = "packs"  # pack object key -> PackInfo
PACKED = "packed"  # pack key \0 sid, first position -> b"": the live slices of each pack
# New families go at the end: a snapshot names a family by its position in this list.
COLUMN_FAMILIES = [
    "default", BUCKETS, NAMES, STREAMS, DATA, PRODUCERS, SM_META, SEGMENTS, GC_QUEUE, STREAM_SNAPSHOTS, SUBSCRIPTIONS,
    PACKS, PACKED,
]  # fmt: skip

APPLIED_KEY = b"applied"  # index and term of the last applied entry
MEMBERSHIP_KEY = b"membership"  # the last applied Membership, as its entry carried it
SYNCED_KEY = b"synced"
NEXT_SID_KEY = b"next_sid"

U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_APPLIED = struct.Struct(">QQ")
_POS = struct.Struct(">QQ")

# A record is a small header (format version, append time) and the payload. Version 2 also
# carries the producer (epoch, seq, id length, id) that appended it, for the cold tier's rows.
_RECORD_HEADER = struct.Struct(">BQ")
_PRODUCER_HEADER = struct.Struct(">QQH")
RECORD_HEADER_SIZE = _RECORD_HEADER.size
LARGE_RECORD = 1 << 20  # records past this are staged in pieces
_RECORD_V1 = 1
_RECORD_V2 = 2


class StreamMeta(msgspec.Struct, array_like=True):
    sid: int
    bucket: str
    name: str
    content_type: str
    json: bool
    created_at: int
    touched_at: int
    ttl: int | None = None
    expires_at: int | None = None
    closed: bool = False
    tail: int = 0
    stream_seq: str | None = None
    fork_of: int | None = None
    fork_pos: int = 0  # own records start here; below it, data comes from fork_of
    fork_offset: int = 0  # as requested, for idempotent re-create
    fork_sub: int = 0
    forks: int = 0  # live direct forks holding a reference
    deleted: bool = False  # soft-deleted: kept while forks reference it
    tiered: int = 0  # own records below this are in object-store segments (starts at fork_pos)
    evicted: int = 0  # own records below this are no longer on local disk (<= tiered)
    earliest: int = 0  # retention: reads below this answer 410
    attrs: bytes = b""  # application-owned JSON object, canonical; empty when unset
    retention_age: int | None = None  # seconds: automatic retention by append time
    retention_bytes: int | None = None  # automatic retention by size
    latest_snapshot: int | None = None  # position of the newest published snapshot

    def expiry(self, touched_at: int = 0) -> int | None:
        """The instant (ms) this stream expires, if it can (`touched_at`: a later access not yet replicated)."""
        candidates = []
        if self.ttl is not None:
            candidates.append(max(self.touched_at, touched_at) + self.ttl * 1000)
        if self.expires_at is not None:
            candidates.append(self.expires_at)
        return min(candidates) if candidates else None

    def expired(self, now: int, touched_at: int = 0) -> bool:
        if self.ttl is not None and now >= max(self.touched_at, touched_at) + self.ttl * 1000:
            return True
        return self.expires_at is not None and now >= self.expires_at


class ProducerState(msgspec.Struct, array_like=True):
    epoch: int
    seq: int
    next_pos: int  # tail after this producer's last accepted append


class SegmentInfo(msgspec.Struct, array_like=True, frozen=True):
    """A sealed segment in the object store: positions [lo, hi) of one stream's own records."""

    lo: int
    hi: int
    key: str
    size: int
    sha256: str
    min_time: int
    max_time: int
    starts: bytes  # record starts relative to lo (encode_starts): boundaries survive eviction
    # A slice of a pack (app/tiering/pack.py) has its rows at `row` of row group `group`; `size` and
    # `sha256` are then the whole pack's, and `digest` is the SHA-256 of the slice's payloads.
    group: int = -1
    row: int = 0
    digest: str = ""

    @property
    def records(self) -> int:
        return len(self.starts) // 4

    @property
    def packed(self) -> bool:
        return self.group >= 0

    def record_starts(self) -> list[int]:
        """Where each of the segment's records starts."""
        return [self.lo + _U32.unpack_from(self.starts, i)[0] for i in range(0, len(self.starts), 4)]

    def has_start(self, pos: int) -> bool:
        """Whether a record of the segment starts at `pos` (a binary search; no decoding of the list)."""
        rel, lo, hi = pos - self.lo, 0, len(self.starts) // 4
        while lo < hi:
            mid = (lo + hi) // 2
            value = _U32.unpack_from(self.starts, mid * 4)[0]
            if value == rel:
                return True
            lo, hi = (mid + 1, hi) if value < rel else (lo, mid)
        return False


class PackInfo(msgspec.Struct, array_like=True):
    """A pack in the object store and how many of its slices streams still hold."""

    bucket: str
    size: int
    sha256: str
    live: int  # slices still referenced; at 0 the pack and its index are queued for deletion
    slices: int  # slices it was written with


def packed_key(pack: str, sid: int, pos: int) -> bytes:
    return pack.encode() + b"\0" + _POS.pack(sid, pos)


def packed_slice(key: bytes) -> tuple[int, int]:
    """(sid, first position) of a PACKED key."""
    sid, pos = _POS.unpack(key[-16:])
    return sid, pos


def encode_starts(lo: int, positions: list[int]) -> bytes:
    """SegmentInfo.starts for records starting at `positions`: big-endian u32 offsets from `lo`."""
    return b"".join(_U32.pack(pos - lo) for pos in positions)


class PublishedSnapshot(msgspec.Struct, array_like=True, frozen=True):
    """An application's snapshot of a stream at a position: inline, or an object in the store."""

    content_type: str
    sha256: str
    size: int
    created_at: int
    inline: bytes | None = None
    key: str | None = None


_meta_encoder = msgspec.msgpack.Encoder()
_meta_decoder = msgspec.msgpack.Decoder(StreamMeta)
_producer_decoder = msgspec.msgpack.Decoder(ProducerState)
_segment_decoder = msgspec.msgpack.Decoder(SegmentInfo)
_snapshot_decoder = msgspec.msgpack.Decoder(PublishedSnapshot)


def encode(obj: msgspec.Struct) -> bytes:
    return _meta_encoder.encode(obj)


def decode_meta(raw: bytes) -> StreamMeta:
    return _meta_decoder.decode(raw)


def decode_producer(raw: bytes) -> ProducerState:
    return _producer_decoder.decode(raw)


def decode_segment(raw: bytes) -> SegmentInfo:
    return _segment_decoder.decode(raw)


_pack_decoder = msgspec.msgpack.Decoder(PackInfo)


def decode_pack(raw: bytes) -> PackInfo:
    return _pack_decoder.decode(raw)


_retention_decoder = msgspec.msgpack.Decoder(tuple[int | None, int | None])


def encode_retention(age: int | None, size: int | None) -> bytes:
    return _meta_encoder.encode((age, size))


def decode_retention(raw: bytes) -> tuple[int | None, int | None]:
    return _retention_decoder.decode(raw)


def decode_snapshot(raw: bytes) -> PublishedSnapshot:
    return _snapshot_decoder.decode(raw)


def name_key(bucket: str, stream: str) -> bytes:
    return bucket.encode() + b"\x00" + stream.encode()


def split_name_key(key: bytes) -> tuple[str, str]:
    bucket, _, stream = key.partition(b"\x00")
    return bucket.decode(), stream.decode()


def sid_key(sid: int) -> bytes:
    return U64.pack(sid)


def data_key(sid: int, pos: int) -> bytes:
    return _POS.pack(sid, pos)


def data_pos(key: bytes) -> int:
    return _POS.unpack(key)[1]


def data_sid_pos(key: bytes) -> tuple[int, int]:
    sid, pos = _POS.unpack(key)
    return sid, pos


def producer_key(sid: int, producer_id: str) -> bytes:
    return U64.pack(sid) + producer_id.encode()


def encode_record(now: int, payload: Buffer, producer: tuple[str, int, int] | None = None) -> bytes | Parts:
    """The record's bytes; a large one as (header, payload), so the payload is not copied here."""
    if producer is None:
        header = _RECORD_HEADER.pack(_RECORD_V1, now)
    else:
        pid = producer[0].encode()
        header = _RECORD_HEADER.pack(_RECORD_V2, now) + _PRODUCER_HEADER.pack(producer[1], producer[2], len(pid)) + pid
    return (header, payload) if len(payload) > LARGE_RECORD else header + payload


def _payload_start(value: bytes) -> int:
    if value[0] == _RECORD_V1:
        return RECORD_HEADER_SIZE
    return RECORD_HEADER_SIZE + _PRODUCER_HEADER.size + _PRODUCER_HEADER.unpack_from(value, RECORD_HEADER_SIZE)[2]


def record_payload(value: bytes) -> memoryview:
    return memoryview(value)[_payload_start(value) :]


def record_producer(value: bytes) -> tuple[str, int, int] | None:
    """(id, epoch, seq) of the producer that appended the record, if one did."""
    if value[0] == _RECORD_V1:
        return None
    epoch, seq, length = _PRODUCER_HEADER.unpack_from(value, RECORD_HEADER_SIZE)
    start = RECORD_HEADER_SIZE + _PRODUCER_HEADER.size
    return value[start : start + length].decode(), epoch, seq


def record_time(value: bytes) -> int:
    return _RECORD_HEADER.unpack_from(value)[1]


def encode_applied(index: int, term: int) -> bytes:
    return _APPLIED.pack(index, term)


def decode_applied(raw: bytes | None) -> tuple[int, int]:
    """(index, term); stores written before terms were recorded give term 0."""
    if raw is None:
        return 0, 0
    if len(raw) == U64.size:
        return U64.unpack(raw)[0], 0
    index, term = _APPLIED.unpack(raw)
    return index, term


class Subscription(msgspec.Struct, kw_only=True):
    """A consumer group over the streams of one scope (a bucket, and a path prefix in it, `root`).

    Stored as a map, so later fields can be added. `acked` holds each stream's acknowledged position
    (by its path below `root`); `generation` fences a wake or claim, `holder` holds it until
    `lease_until` (ms, the proposing leader's clock), and `token_sha256` is its bearer token's digest.
    A pull-wake subscription's wake event is appended once per generation (`woke_generation`).
    """

    bucket: str
    root: str
    id: str
    type: str  # "webhook" or "pull-wake"
    pattern: str | None = None
    explicit: list[str] = msgspec.field(default_factory=list)
    webhook_url: str | None = None
    wake_stream: str | None = None
    lease_ttl_ms: int = 30_000
    description: str | None = None
    base_url: str = ""  # the root's absolute URL as the creator reached it (for callback URLs)
    created_at: int = 0
    acked: dict[str, int] = msgspec.field(default_factory=dict)
    generation: int = 0
    wake_id: str | None = None
    holder: str | None = None
    lease_until: int = 0
    token_sha256: str | None = None
    woke_generation: int = -1  # pull-wake: the generation the last wake event announced


_subscription_decoder = msgspec.msgpack.Decoder(Subscription)


def subscription_key(bucket: str, root: str, sub_id: str) -> bytes:
    return f"{bucket}\0{root}\0{sub_id}".encode()


def decode_subscription(raw: bytes) -> Subscription:
    return _subscription_decoder.decode(raw)
