"""Rules of buckets: namespaces of streams, each with optional default retention for its streams."""

from __future__ import annotations

from app.state_machine import records as r
from app.state_machine.commands import Code, CreateBucket, DeleteBucket, Outcome
from app.state_machine.expiry import live
from app.state_machine.subscriptions import delete_subscription_key
from app.state_machine.table import BUILTIN_BUCKETS, StreamTable


def create_bucket(table: StreamTable, cmd: CreateBucket, now: int) -> Outcome:
    if cmd.bucket in table.buckets:
        return Outcome(Code.EXISTS)
    table.buckets[cmd.bucket] = now
    value = r.U64.pack(now)
    if cmd.retention_age is not None or cmd.retention_bytes is not None:
        table.bucket_retention[cmd.bucket] = (cmd.retention_age, cmd.retention_bytes)
        value += r.encode_retention(cmd.retention_age, cmd.retention_bytes)
    table.batch.put(r.BUCKETS, cmd.bucket.encode(), value)
    return Outcome(Code.CREATED)


def delete_bucket(table: StreamTable, cmd: DeleteBucket, now: int) -> Outcome:
    if cmd.bucket not in table.buckets or cmd.bucket in BUILTIN_BUCKETS:
        return Outcome(Code.BUCKET_NOT_FOUND)
    # Expired streams do not count: they are collected, in name order, up to the first live one.
    for meta in table.streams_under(cmd.bucket, ""):
        if live(table, meta.bucket, meta.name, now) is not None:
            return Outcome(Code.BUCKET_NOT_EMPTY, "the bucket still holds streams")
    del table.buckets[cmd.bucket]
    table.bucket_retention.pop(cmd.bucket, None)
    table.batch.delete(r.BUCKETS, cmd.bucket.encode())
    prefix = f"{cmd.bucket}\0".encode()  # its subscriptions go with it, those of this batch too
    for key in sorted(table.scan(r.SUBSCRIPTIONS, prefix, prefix[:-1] + b"\1")):
        delete_subscription_key(table, key)
    return Outcome(Code.DELETED)
