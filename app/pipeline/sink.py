"""`df.write.format("rill")` and `writeStream.format("rill")`: rows appended to streams, each once.

Each row's `payload` (binary or string) is appended to the stream in its `stream` column, or in
the option `stream`. Every task appends as an idempotent producer of its own: the producer id
names the job (or the streaming query) and the task's partition, and the seq counts the rows the
task has sent to that stream. A retried task reads the same rows in the same order (so a
partition's rows must come in a deterministic order) and sends the same (producer, epoch, seq)
again: the server answers its repeats as duplicates instead of appending them twice. A batch job
keeps epoch 0; a streaming query's epoch is its micro-batch id, which grows from batch to batch
and is the same when a batch is replayed after a restart. A batch write's producers name a new job
each time, unless the option `job` names it: then a failed write run again appends nothing twice.

JSON streams take each payload as one message (an array payload stays one message).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import httpx
from pyspark import TaskContext
from pyspark.sql import datasource as sds
from pyspark.sql.types import BinaryType, StringType, StructType

from app.domain.media import JSON, media_type
from app.pipeline.hot import Server, ServerError, refused, stream_path

SINK_OPTIONS = ("url", "token", "bucket", "stream", "job")
_JOB = re.compile(r"[A-Za-z0-9._-]{1,64}")
_SPARKS = ("checkpointlocation", "path")  # what Spark itself passes along with a query's options


@dataclass(frozen=True)
class SinkOptions:
    server: Server
    bucket: str
    stream: str | None  # the target when rows have no `stream` column
    job: str | None = None  # names a batch write's producers: the same job run again appends nothing twice

    @classmethod
    def parse(cls, options: Mapping[str, str], schema: StructType) -> SinkOptions:
        opts = {k.lower(): v for k, v in options.items()}
        unknown = sorted(set(opts) - set(SINK_OPTIONS) - set(_SPARKS))
        if unknown:
            raise ValueError(f"unknown rill sink option(s) {unknown}; known: {list(SINK_OPTIONS)}")
        url, bucket = opts.get("url"), opts.get("bucket")
        if not url or not url.startswith(("http://", "https://")):
            raise ValueError(f"the rill sink needs option 'url', a Rill server's http(s) base URL, not {url!r}")
        if not bucket or "/" in bucket:
            raise ValueError(f"option 'bucket' is required and may not contain '/': {bucket!r}")
        names = {f.name: f.dataType for f in schema.fields}
        if not isinstance(names.get("payload"), BinaryType | StringType):
            raise ValueError("the rill sink writes a 'payload' column of binary or string; the data has none")
        if "stream" in names and not isinstance(names["stream"], StringType):
            raise ValueError("the rill sink's 'stream' column must be a string")
        if "stream" not in names and not opts.get("stream"):
            raise ValueError("the rill sink needs option 'stream' or a 'stream' column")
        job = opts.get("job")
        if job is not None and not _JOB.fullmatch(job):
            raise ValueError(f"option 'job' is 1 to 64 of A-Z, a-z, 0-9 and '._-', not {job[:100]!r}")
        return cls(Server(url, opts.get("token") or None), bucket, opts.get("stream"), job)


@dataclass
class Appended(sds.WriterCommitMessage):
    rows: int  # sent, whether appended or answered as a duplicate


@dataclass
class _Producer:
    """One task's appends, as an idempotent producer: its next seq and content type per stream."""

    opts: SinkOptions
    producer_id: str
    epoch: int
    seqs: dict[str, int] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)

    def append_all(self, rows: Iterator[tuple[str, bytes]]) -> Appended:
        sent = 0
        with self.opts.server.client() as http:
            for stream, payload in rows:
                self._append(http, stream, payload)
                sent += 1
        return Appended(sent)

    def _append(self, http: httpx.Client, stream: str, payload: bytes) -> None:
        path = stream_path(self.opts.bucket, stream)
        if stream not in self.types:
            response = http.head(path)
            if response.status_code != 200:
                raise refused(response, f"writing to {self.opts.bucket}/{stream} on {self.opts.server.url}")
            self.types[stream] = response.headers.get("content-type", "application/octet-stream")
        content_type = self.types[stream]
        body = b"[" + payload + b"]" if media_type(content_type) == JSON else payload
        seq = self.seqs.get(stream, 0)
        headers = {
            "content-type": content_type,
            "producer-id": self.producer_id,
            "producer-epoch": str(self.epoch),
            "producer-seq": str(seq),
        }
        response = http.post(path, content=body, headers=headers)
        if response.status_code not in (200, 204):
            raise refused(response, f"appending to {self.opts.bucket}/{stream} as {self.producer_id}")
        self.seqs[stream] = seq + 1


def _rows(opts: SinkOptions, rows: Iterator[sds.Row]) -> Iterator[tuple[str, bytes]]:
    for row in rows:
        values = row.asDict()
        stream = values.get("stream") or opts.stream
        if not stream:
            raise ServerError("a row has no stream (a null 'stream' and no option 'stream')")
        payload = values["payload"]
        if payload is None:
            raise ServerError(f"a row for {stream} has a null payload")
        yield stream, payload.encode() if isinstance(payload, str) else bytes(payload)


def _partition() -> int:
    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


class RillWriter(sds.DataSourceWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts
        # Made on the driver, so every attempt of a task shares it; a job named by the option is the same
        # when the write is run again, whose tasks then send the same producers and seqs (given the same
        # rows in the same partitions and order).
        self.job = f"job-{opts.job}" if opts.job is not None else uuid.uuid4().hex[:16]

    def write(self, iterator: Iterator[sds.Row]) -> Appended:
        producer = _Producer(self.opts, f"spark-{self.job}-{_partition()}", 0)
        return producer.append_all(_rows(self.opts, iterator))


class RillStreamWriter(sds.DataSourceStreamWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[sds.Row]) -> Appended:
        # Without the query's id and the batch's, retries could not be told from new rows: refuse.
        context = TaskContext.get()
        batch = context.getLocalProperty("streaming.sql.batchId") if context is not None else None
        query = context.getLocalProperty("sql.streaming.queryId") if context is not None else None
        if batch is None or query is None:
            raise ServerError("the rill stream sink runs only inside a streaming query (no query or batch id)")
        producer = _Producer(self.opts, f"spark-{query}-{_partition()}", int(batch))
        return producer.append_all(_rows(self.opts, iterator))

    def commit(self, messages: list[sds.WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        pass  # every append is durable when the server answers it

    def abort(self, messages: list[sds.WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        pass  # what was appended stays; a replay of the batch is answered as duplicates
