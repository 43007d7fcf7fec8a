"""Spark through the `rill` data source against plain pyarrow on the same segments.

    python -m app.pipeline.bench --generate-mb 150 [--store file:///tmp/rill-bench] [--bucket bench]

`--generate-mb` first writes that much payload as segments into the store; without it the store's
existing segments are read. Both sides compute the same sum of payload lengths.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from app.pipeline import register
from app.pipeline.options import ReadOptions
from app.pipeline.planning import PlannedSegment, plan, store_for, units
from app.tiering.segment import Manifest, Record, build, entry, manifest_key, segment_key
from app.tiering.store import open_store


def spark_vs_pyarrow(
    store_url: str, bucket: str, options: dict[str, str], master: str = "local[2]", rounds: int = 3
) -> dict[str, Any]:
    """Seconds and MB/s (of payload) for pyarrow and for Spark jobs over the same segments; best of `rounds`.

    Spark's session start-up is left out; each Spark round includes planning (manifests) and the job, once
    with a partition per segment (the default) and once with segments packed into fewer partitions.
    The first Spark round also pays for starting Python workers and the JIT: it is reported on its own.
    """
    from app.pipeline.export import build_session

    opts = {"store": store_url, "bucket": bucket, "include_hot": "false", **options}
    read_options = ReadOptions.parse(opts)
    segments = plan(read_options)
    store = store_for(read_options)

    def with_pyarrow(columns: list[str] | None) -> tuple[float, int, int]:
        started = time.perf_counter()
        payload = size = 0
        for unit in units(segments):  # a segment, or a pack's planned slices
            data = store.get(unit[0].key)
            size += len(data)
            for table in _tables(data, unit, columns):
                payload += pc.sum(pc.binary_length(table["payload"])).as_py() or 0
        return time.perf_counter() - started, payload, size

    pa_runs = [with_pyarrow(None) for _ in range(rounds)]
    pa_seconds, pa_payload, object_bytes = min(pa_runs)
    payload_only_seconds = min(with_pyarrow(["payload"])[0] for _ in range(rounds))

    spark, owned = build_session(master, "rill-bench")
    best: dict[str, float] = {}
    first = 0.0
    try:
        register(spark)
        spark.range(1).count()  # the JVM's first job (class loading, executors) is session start-up
        # Packed: about two tasks per core, each reading several segments (see `max_partition_bytes`).
        packed = {
            "max_partition_bytes": str(256 << 20),
            "min_partitions": str(2 * spark.sparkContext.defaultParallelism),
        }
        rows = {**packed, **opts, "arrow": "false"}  # a Python tuple per row: what the Arrow batches save
        variants = {"per_segment": opts, "packed": {**packed, **opts}, "packed_rows": rows}
        for _ in range(rounds):
            for name, variant in variants.items():
                seconds, total = _spark_sum(spark, variant)
                if total != pa_payload:
                    raise AssertionError(f"Spark summed {total} payload bytes, pyarrow {pa_payload}")
                first = first or seconds
                best[name] = min(best.get(name, seconds), seconds)
    finally:
        if owned:
            spark.stop()
    mb = pa_payload / 1e6
    result: dict[str, Any] = {
        "segments": len(segments),
        "object_mb": round(object_bytes / 1e6, 1),
        "payload_mb": round(mb, 1),
        "pyarrow_seconds": round(pa_seconds, 3),
        "pyarrow_payload_column_only_seconds": round(payload_only_seconds, 3),
        "pyarrow_mb_s": round(mb / pa_seconds, 1),
        "spark_first_round_seconds": round(first, 3),
    }
    for name, seconds in best.items():
        result[f"spark_{name}_seconds"] = round(seconds, 3)
        result[f"spark_{name}_mb_s"] = round(mb / seconds, 1)
        # Throughput ratio: 1.0 would be as fast as pyarrow.
        result[f"spark_{name}_vs_pyarrow"] = round(pa_seconds / seconds, 3)
    return result


def _tables(data: bytes, unit: list[PlannedSegment], columns: list[str] | None) -> list[pa.Table]:
    """A segment's rows, or the rows of the slices of a pack."""
    if not unit[0].packed:
        return [pq.read_table(pa.BufferReader(data), columns=columns)]
    file = pq.ParquetFile(pa.BufferReader(data))
    groups = {g: file.read_row_group(g, columns=columns) for g in sorted({s.group for s in unit})}
    return [groups[s.group].slice(s.row, s.records) for s in unit]


def _spark_sum(spark: Any, options: dict[str, str]) -> tuple[float, int]:
    """Seconds for planning and running `sum(length(payload))` through the data source, and the sum."""
    from pyspark.sql import functions as F

    started = time.perf_counter()
    df = spark.read.format("rill").options(**options).load()
    row = df.agg(F.coalesce(F.sum(F.length("payload")), F.lit(0)).alias("n")).collect()[0]
    return time.perf_counter() - started, int(row["n"])


def generate(store_url: str, bucket: str, mb: float, streams: int = 4, record_bytes: int = 1024) -> int:
    """Writes about `mb` MB of JSON-ish payload as segments of ~16 MB and manifests; returns the records."""
    store = open_store(store_url)
    rng = random.Random(7)
    per_stream = int(mb * 1e6 / record_bytes / streams)
    per_segment = max(1, int(16e6 / record_bytes))
    base = 1_700_000_000_000
    for s in range(streams):
        name = f"bench/{s}"
        manifest = Manifest(bucket, name, "application/json")
        pos = 0
        for start in range(0, per_stream, per_segment):
            records = []
            for i in range(start, min(per_stream, start + per_segment)):
                # JSON around base64 of random bytes: zstd gains little, so objects weigh about the payload.
                blob = base64.b64encode(rng.randbytes(max(1, (record_bytes - 48) * 3 // 4))).decode()
                payload = json.dumps({"i": i, "kind": "event", "data": blob}).encode()
                records.append(Record(pos, base + i, payload))
                pos += len(payload)
            data = build(bucket, name, "application/json", records)
            lo, hi = records[0].pos, pos
            key = segment_key(bucket, name, lo, hi)
            store.put(key, data)
            manifest.segments.append(entry(bucket, name, records, data))
        store.put(manifest_key(bucket, name), manifest.to_json())
    return per_stream * streams


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m app.pipeline.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default="file:///tmp/rill-bench")
    parser.add_argument("--bucket", default="bench")
    parser.add_argument("--prefix", help="read only streams whose name starts with this")
    parser.add_argument("--generate-mb", type=float, help="first write this many MB of payload")
    parser.add_argument("--record-bytes", type=int, default=1024, help="payload size of generated records")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    if args.generate_mb:
        generate(args.store, args.bucket, args.generate_mb, record_bytes=args.record_bytes)
    options = {"prefix": args.prefix} if args.prefix else {}
    print(json.dumps(spark_vs_pyarrow(args.store, args.bucket, options, args.master, args.rounds), indent=1))


if __name__ == "__main__":
    main()
