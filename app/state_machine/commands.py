"""Commands the Raft log carries, and the outcomes applying them produces.

A command holds everything apply needs; apply looks nothing up outside the
state machine. The leader stamps `now` (milliseconds since the epoch) into
the envelope, so every replica expires and timestamps identically.
"""

from __future__ import annotations

from enum import Enum

import msgspec

from app.state_machine.records import SegmentInfo, Subscription


class Producer(msgspec.Struct, array_like=True, frozen=True):
    id: str
    epoch: int
    seq: int


class CreateBucket(msgspec.Struct, tag="cb", array_like=True):
    bucket: str
    retention_age: int | None = None  # defaults for streams created in the bucket without their own
    retention_bytes: int | None = None


class DeleteBucket(msgspec.Struct, tag="db", array_like=True):
    bucket: str


class CreateStream(msgspec.Struct, tag="cs", array_like=True):
    bucket: str
    stream: str
    content_type: str
    json: bool
    ttl: int | None = None  # seconds, sliding
    expires_at: int | None = None  # ms
    closed: bool = False
    # The initial record (JSON: messages joined by commas); empty for none. Decoded as a view
    # into the log entry, so applying a large append copies it only into the store.
    body: memoryview = memoryview(b"")
    fork_stream: str | None = None  # in the same bucket
    fork_offset: int | None = None  # None: the source's tail
    fork_sub: int = 0
    content_type_given: bool = True
    touched: int = 0  # the leader's latest local read of an existing stream (sliding TTL)
    evicted_record: bytes | None = None  # the source record at fork_offset, when only the cold tier has it
    attrs: bytes = b""  # canonical JSON from Stream-Attrs; part of idempotent-create matching
    retention_age: int | None = None
    retention_bytes: int | None = None
    source_touched: int = 0  # as `touched`, for the fork source


class Append(msgspec.Struct, tag="ap", array_like=True):
    bucket: str
    stream: str
    content_type: str | None
    body: memoryview  # one record; empty only with close; a view into the entry, as above
    stream_seq: str | None = None
    producer: Producer | None = None
    close: bool = False
    touched: int = 0


class AppendBatch(msgspec.Struct, tag="ab", array_like=True):
    """Frames appended one after another in one entry; each has its own outcome."""

    bucket: str
    stream: str
    content_type: str | None
    bodies: list[bytes]
    touched: int = 0


class SetAttrs(msgspec.Struct, tag="sa", array_like=True):
    bucket: str
    stream: str
    attrs: bytes  # canonical JSON object
    touched: int = 0


class Retain(msgspec.Struct, tag="rt", array_like=True):
    """Discards the stream's history before `pos`. `auto` (the leader's retention sweep) stops at
    the latest snapshot instead of failing past it."""

    bucket: str
    stream: str
    pos: int
    auto: bool = False
    touched: int = 0


class PublishSnapshot(msgspec.Struct, tag="ps", array_like=True):
    bucket: str
    stream: str
    pos: int
    content_type: str
    sha256: str
    size: int
    inline: bytes | None = None  # small blobs live in the state machine
    key: str | None = None  # large ones in the object store, uploaded before this was proposed
    match: str | None = None  # compare-and-set: the latest snapshot's digest must be this
    touched: int = 0


class DeleteSnapshot(msgspec.Struct, tag="xs", array_like=True):
    bucket: str
    stream: str
    pos: int
    touched: int = 0


class DeleteStream(msgspec.Struct, tag="ds", array_like=True):
    bucket: str
    stream: str
    touched: int = 0


class Touch(msgspec.Struct, tag="tt", array_like=True):
    """Renews a sliding TTL (rate-limited by the caller)."""

    bucket: str
    stream: str


class CollectExpired(msgspec.Struct, tag="gc", array_like=True):
    """Hard- or soft-deletes the listed streams if they have expired by `now`."""

    sids: list[int]


class TierSegment(msgspec.Struct, tag="ts", array_like=True):
    """Records that stream `sid`'s segment, uploaded and verified, is in the object store.

    Ignored unless the stream still exists and its tiering has reached exactly the segment's start.
    """

    sid: int
    segment: SegmentInfo


class TierPack(msgspec.Struct, tag="tp", array_like=True):
    """Records a pack of bucket `bucket`, uploaded and verified: each slice (a stream's sid and its
    SegmentInfo in the pack) is taken as TierSegment would take it, and the pack counts the ones taken."""

    bucket: str
    key: str
    size: int
    sha256: str
    slices: list[tuple[int, SegmentInfo]]


class MergeSegments(msgspec.Struct, tag="ms", array_like=True):
    """Replaces stream `sid`'s segments that tile [segment.lo, segment.hi) exactly by `segment`, uploaded
    and verified, which holds the same records; the replaced objects (or pack slices) are released."""

    sid: int
    segment: SegmentInfo


class Evict(msgspec.Struct, tag="ev", array_like=True):
    """Drops the local copy of stream `sid`'s tiered records below `upto` (a segment end)."""

    sid: int
    upto: int


class ForgetObjects(msgspec.Struct, tag="fo", array_like=True):
    """Takes object keys off the deletion queue once the store has deleted them."""

    keys: list[str]


class PutSubscription(msgspec.Struct, tag="su", array_like=True):
    """Creates a subscription, or confirms one with the same configuration."""

    bucket: str
    root: str
    id: str
    kind: str  # "webhook" or "pull-wake"
    pattern: str | None
    streams: list[str]
    webhook_url: str | None
    wake_stream: str | None
    lease_ttl_ms: int
    description: str | None
    base_url: str = ""  # the root's URL as its creator reached it, for callback URLs


class DeleteSubscription(msgspec.Struct, tag="du", array_like=True):
    bucket: str
    root: str
    id: str


class LinkStreams(msgspec.Struct, tag="ls", array_like=True):
    """Adds and removes a subscription's explicit streams (paths below its root)."""

    bucket: str
    root: str
    id: str
    add: list[str]
    remove: list[str]


class Claim(msgspec.Struct, tag="cl", array_like=True):
    """Takes a subscription's lease for `holder` (a pull-wake worker, or the webhook delivery) under
    a new generation and wake id, unless another holder's lease is still running."""

    bucket: str
    root: str
    id: str
    holder: str
    wake_id: str
    token_sha256: str


class Ack(msgspec.Struct, tag="ak", array_like=True):
    """Acknowledges positions (path, position) under the current generation and wake; `done` ends
    the lease, `release` ends it acknowledging nothing more."""

    bucket: str
    root: str
    id: str
    wake_id: str
    generation: int
    token_sha256: str
    acks: list[tuple[str, int]]
    done: bool = False


class Wake(msgspec.Struct, tag="wk", array_like=True):
    """Appends a pull-wake subscription's wake event for `generation`, unless done already (the
    leader's retry when the append that made data pending could not write it, or a lease ran out)."""

    bucket: str
    root: str
    id: str
    generation: int


Command = (
    CreateBucket
    | DeleteBucket
    | CreateStream
    | Append
    | DeleteStream
    | Touch
    | CollectExpired
    | TierSegment
    | TierPack
    | MergeSegments
    | Evict
    | ForgetObjects
    | AppendBatch
    | SetAttrs
    | Retain
    | PublishSnapshot
    | DeleteSnapshot
    | PutSubscription
    | DeleteSubscription
    | LinkStreams
    | Claim
    | Ack
    | Wake
)


class Envelope(msgspec.Struct, array_like=True):
    now: int
    command: Command


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Envelope)


_LARGE_BODY = 1 << 20


def encode_envelope(now: int, command: Command) -> bytes | bytearray:
    envelope = Envelope(now, command)
    if not isinstance(command, Append | CreateStream) or len(command.body) <= _LARGE_BODY:
        return _encoder.encode(envelope)
    # Encoded into a buffer of the final size: a growing one would hold the body twice while it grows.
    bare = Envelope(now, msgspec.structs.replace(command, body=memoryview(b"")))
    buffer = bytearray(len(_encoder.encode(bare)) + 4 + len(command.body))  # bin 32's length vs bin 8's
    _encoder.encode_into(envelope, buffer)
    return buffer


def decode_envelope(raw: bytes) -> Envelope:
    return _decoder.decode(raw)


class Code(Enum):
    CREATED = "created"
    EXISTS = "exists"
    APPENDED = "appended"
    DUPLICATE = "duplicate"
    DELETED = "deleted"
    OK = "ok"
    NOT_FOUND = "not_found"
    BUCKET_NOT_FOUND = "bucket_not_found"
    BUCKET_NOT_EMPTY = "bucket_not_empty"
    GONE = "gone"
    STALE = "stale"
    NOT_BOUNDARY = "offset_not_boundary"
    BEYOND_TAIL = "offset_beyond_tail"
    TRIMMED = "offset_trimmed"
    RETENTION_BACKWARDS = "retention_backwards"
    BEYOND_SNAPSHOT = "retention_beyond_snapshot"
    SNAPSHOT_CONFLICT = "snapshot_conflict"
    SNAPSHOT_MISMATCH = "snapshot_match_failed"
    SNAPSHOT_NOT_FOUND = "snapshot_not_found"
    SNAPSHOT_LATEST = "snapshot_is_latest"
    CONFIG_MISMATCH = "config_mismatch"
    CONTENT_TYPE_MISMATCH = "content_type_mismatch"
    STREAM_CLOSED = "stream_closed"
    SEQ_CONFLICT = "stream_seq_conflict"
    SOURCE_DELETED = "fork_source_deleted"
    BAD_FORK_OFFSET = "bad_fork_offset"
    BAD_SUB_OFFSET = "bad_fork_sub_offset"
    STALE_EPOCH = "producer_stale_epoch"
    SEQ_GAP = "producer_seq_gap"
    BAD_EPOCH_SEQ = "producer_epoch_seq"
    SUBSCRIPTION_NOT_FOUND = "subscription_not_found"
    ALREADY_CLAIMED = "ALREADY_CLAIMED"
    FENCED = "FENCED"
    INVALID_PATTERN = "INVALID_PATTERN"
    WAKE_STREAM_NOT_FOUND = "WAKE_STREAM_NOT_FOUND"
    WAKE_STREAM_COVERED = "WAKE_STREAM_COVERED"
    TOO_MANY_LINKS = "TOO_MANY_STREAMS"
    TOO_MANY_SUBSCRIPTIONS = "TOO_MANY_SUBSCRIPTIONS"


class Outcome(msgspec.Struct):
    code: Code
    message: str = ""
    sid: int = 0
    next_pos: int = 0
    closed: bool = False
    producer_epoch: int | None = None
    producer_seq: int | None = None
    expected_seq: int | None = None
    received_seq: int | None = None
    fresh_producer: bool = False  # a producer append that was accepted (200, not 204)
    earliest: int = 0
    batch: list[Outcome] | None = None  # AppendBatch: one outcome per frame
    snapshot_pos: int | None = None
    snapshot_sha256: str | None = None
    subscription: Subscription | None = None  # the subscription as the command left it
