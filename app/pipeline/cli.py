"""`rill pipeline export --store URL --bucket B [--stream S | --prefix P] --out DIR [--master local[2]]`."""

from __future__ import annotations

import argparse
import os

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from app.tiering.store import StoreUnavailable

# Credentials for the executors: a cluster's workers may not share the driver's environment.
_AWS_ENV = {"access_key_id": "AWS_ACCESS_KEY_ID", "secret_access_key": "AWS_SECRET_ACCESS_KEY"}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pipeline = sub.add_parser("pipeline", help="Spark jobs over the cold tier's segments")
    jobs = pipeline.add_subparsers(dest="pipeline_command", required=True)
    p = jobs.add_parser("export", help="write cold segments as Parquet partitioned by bucket/stream/date")
    p.add_argument("--store", required=True, help="s3://bucket/prefix or file:///dir (the server's cold store)")
    p.add_argument("--bucket", required=True, help="the Rill bucket to export")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--stream", help="only this stream")
    which.add_argument("--prefix", help="only streams whose name starts with this")
    p.add_argument("--out", required=True, help="output directory or URI Spark can write (file://, s3a://, …)")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--url", help="a Rill server: also export what it has not tiered yet (default: the cold tier only)")
    p.add_argument("--token", default=os.environ.get("RILL_TOKEN"), help="bearer token for --url (default RILL_TOKEN)")
    p.add_argument("--s3-endpoint-url", help="S3 endpoint (MinIO, moto); default AWS")
    p.add_argument("--region", help="S3 region (default AWS_REGION, else us-east-1)")
    p.add_argument("--path-style", choices=("true", "false"), help="S3 path-style addressing")
    p.add_argument("--from-offset", help="first offset token to export (inclusive)")
    p.add_argument("--to-offset", help="offset token to stop at (exclusive)")
    p.add_argument("--start-time", help="ISO 8601 time or ms since the epoch (inclusive)")
    p.add_argument("--end-time", help="ISO 8601 time or ms since the epoch (exclusive)")
    p.add_argument(
        "--mode", default="errorifexists", choices=("errorifexists", "overwrite", "append"), help="if --out exists"
    )
    p.add_argument(
        "--max-partition-mb",
        type=float,
        default=128.0,
        help="pack consecutive segments into Spark tasks of about this size (0: a task per segment; default 128)",
    )


def read_options(args: argparse.Namespace) -> dict[str, str]:
    """The data source options an export's arguments (and the AWS_* environment) stand for."""
    options = {
        "store": args.store,
        "bucket": args.bucket,
        "stream": args.stream,
        "prefix": args.prefix,
        "s3_endpoint_url": args.s3_endpoint_url,
        "region": args.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"),
        "path_style": args.path_style,
        "from_offset": args.from_offset,
        "to_offset": args.to_offset,
        "start_time": args.start_time,
        "end_time": args.end_time,
        "url": args.url,
        "token": args.token if args.url else None,
        "include_hot": "true" if args.url else "false",
    }
    if args.store.startswith("s3://") and all(os.environ.get(v) for v in _AWS_ENV.values()):
        options.update({k: os.environ[v] for k, v in _AWS_ENV.items()})
        options["session_token"] = os.environ.get("AWS_SESSION_TOKEN")
    if args.max_partition_mb > 0:
        options["max_partition_bytes"] = str(int(args.max_partition_mb * (1 << 20)))
    return {k: v for k, v in options.items() if v is not None}


def main(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    out = Console()
    try:
        from pyspark.errors import AnalysisException

        from app.pipeline.export import build_session, export
    except ImportError:
        console.print(
            "rill pipeline needs PySpark: pip install -e '.[pipeline]' in Rill's checkout (and Java 17)",
            style="red",
            markup=False,
        )
        return 2
    options = read_options(args)
    spark, owned = build_session(args.master, "rill-pipeline-export")
    if "max_partition_bytes" in options:  # two tasks per core, so one slow task does not hold up the rest
        options["min_partitions"] = str(2 * spark.sparkContext.defaultParallelism)
    try:
        columns = (TextColumn("exporting"), BarColumn(), MofNCompleteColumn(), TextColumn("tasks"), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task("export", total=None)
            summary = export(
                spark, options, args.out, args.mode, lambda done, total: bar.update(task, completed=done, total=total)
            )
    except (ValueError, StoreUnavailable, AnalysisException) as exc:  # bad options, no store, --out exists
        console.print(f"rill pipeline export: {exc}", style="red", markup=False, soft_wrap=True)
        return 2
    finally:
        if owned:
            spark.stop()
    out.print(
        f"exported {summary.rows:,} rows, {summary.payload_bytes:,} bytes of payload "
        f"from {summary.segments:,} segments in {summary.seconds:.1f} s to {summary.out}",
        soft_wrap=True,
        highlight=False,
    )
    return 0
