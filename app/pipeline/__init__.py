"""Spark over the cold tier: the `rill` data source (`register`), its planner and the export job.

pyspark is the optional `pipeline` extra, so nothing here imports it until it is used: the server
and `rill --help` work without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Spark refuses a Python data source that implements pushFilters unless this is on (off by default in 4.x).
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: SparkSession) -> None:
    """Makes `spark.read.format("rill")` available on this session, with filter pushdown on."""
    from app.pipeline.datasource import RillDataSource

    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(RillDataSource)
