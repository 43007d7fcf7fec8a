"""Spark over Rill: the `rill` data source (`register`, `session`), its planners and the export job.

pyspark is the optional `pipeline` extra (`pip install -e '.[pipeline]'`), so nothing here imports
it until it is used: the server and `rill --help` work without it.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Spark refuses a Python data source that implements pushFilters unless this is on (off by default in 4.x).
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def session(app_name: str = "rill", master: str | None = None) -> SparkSession:
    """A Spark session (the active one, if any) with the `rill` data source registered.

    Spark's Python workers run `python3` from PATH unless told otherwise, and that one may lack
    pyarrow and Rill: the session runs them with this interpreter. `spark.pyspark.python` says so
    to executors; the JVM, which starts the data source's planner, reads `PYSPARK_PYTHON` from the
    environment it is started with (so this must come before the first session).
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master is None or master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # not whatever the host name resolves to
    builder = SparkSession.builder.appName(app_name).config("spark.pyspark.python", sys.executable)
    if master is not None:
        builder = builder.master(master)
    spark = builder.config("spark.sql.session.timeZone", "UTC").getOrCreate()
    register(spark)
    return spark


def register(spark: SparkSession) -> None:
    """Makes `spark.read.format("rill")` available on this session, with filter pushdown on."""
    from app.pipeline.datasource import RillDataSource

    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(RillDataSource)
