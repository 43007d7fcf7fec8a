"""`rill pipeline export`: cold segments to a Parquet dataset partitioned by bucket, stream and UTC date."""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.pipeline import register
from app.pipeline.options import ReadOptions
from app.pipeline.planning import pack, plan

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PARTITION_COLUMNS = ("bucket", "stream", "date")
Progress = Callable[[int, int], None]  # (tasks done, tasks in all)


@dataclass(frozen=True)
class Summary:
    rows: int
    payload_bytes: int
    segments: int
    seconds: float
    out: str


def build_session(master: str = "local[2]", app_name: str = "rill-pipeline") -> tuple[SparkSession, bool]:
    """The active session if there is one (a notebook, a test), else a new one; True when it is ours to stop."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if SparkContext._active_spark_context is not None:  # getOrCreate would hand back its session anyway
        return SparkSession.builder.getOrCreate(), False
    if master.startswith("local"):
        # A local driver must not bind to whatever the host name resolves to.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers need this interpreter's packages (pyarrow, rill); `python3` on PATH may lack them.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "8")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark, True


def _watch(spark: SparkSession, group: str, progress: Progress, done: threading.Event) -> None:
    """Reports the job group's finished and total tasks until `done` is set."""
    tracker = spark.sparkContext.statusTracker()
    while True:
        finished = done.wait(0.25)
        completed = total = 0
        for job in tracker.getJobIdsForGroup(group):
            info = tracker.getJobInfo(job)
            for stage in info.stageIds if info else ():
                stage_info = tracker.getStageInfo(stage)
                if stage_info is not None:
                    completed += stage_info.numCompletedTasks
                    total += stage_info.numTasks
        if total:
            progress(completed, total)
        if finished:
            return


def export(
    spark: SparkSession,
    options: Mapping[str, str],
    out: str,
    mode: str = "errorifexists",
    progress: Progress | None = None,
) -> Summary:
    """Writes the selected segments' rows under `out`/bucket=…/stream=…/date=YYYY-MM-DD/ as Parquet."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    started = time.perf_counter()
    register(spark)
    read_options = ReadOptions.parse(options)
    segments = plan(read_options)
    if progress is not None:  # the total is known before Spark starts: one task per partition
        progress(0, max(1, len(pack(segments, read_options.max_partition_bytes, read_options.min_partitions))))
    df = spark.read.format("rill").options(**options).load()
    # From µs since the epoch, so the date is UTC's whatever the session's time zone is.
    day = F.date_from_unix_date(F.floor(F.unix_micros("append_time") / 86_400_000_000).cast("int"))
    totals = Observation("rill_export")
    df = df.withColumn("date", day).observe(
        totals,
        F.count(F.lit(1)).alias("rows"),
        F.coalesce(F.sum(F.length("payload")), F.lit(0)).cast("long").alias("payload_bytes"),
    )
    group = f"rill-export-{uuid.uuid4().hex}"
    done = threading.Event()
    watcher = None
    if progress is not None:
        watcher = threading.Thread(target=_watch, args=(spark, group, progress, done), daemon=True)
        watcher.start()
    spark.sparkContext.setJobGroup(group, f"rill pipeline export -> {out}")
    try:
        df.write.mode(mode).partitionBy(*PARTITION_COLUMNS).option("compression", "zstd").parquet(out)
    finally:
        for prop in ("spark.jobGroup.id", "spark.job.description"):  # None removes it from later jobs
            spark.sparkContext.setLocalProperty(prop, None)  # type: ignore[arg-type]
        done.set()
        if watcher is not None:
            watcher.join()
    got = totals.get
    return Summary(got["rows"], got["payload_bytes"], len(segments), time.perf_counter() - started, out)
