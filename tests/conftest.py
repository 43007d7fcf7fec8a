from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.moto import MotoS3
from tests.server import RillProcess


@pytest.fixture(scope="session")
def rill(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RillProcess]:
    """One server for the session (long-poll timeout 1 s to keep live tests quick)."""
    server = RillProcess(tmp_path_factory.mktemp("rill") / "data", None, "--long-poll-timeout", "1").start()
    yield server
    server.stop()


@pytest.fixture()
def client(rill: RillProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=rill.url, timeout=10) as c:
        yield c


@pytest.fixture()
def fresh_data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark session with the `rill` data source, for the pipeline and cold tier tests."""
    from pyspark.sql import SparkSession

    from app.pipeline import register

    saved = {k: os.environ.get(k) for k in ("SPARK_LOCAL_IP", "PYSPARK_PYTHON")}
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers need this venv's pyarrow and rill
    session = (
        SparkSession.builder.master("local[2]")
        .appName("rill-pipeline-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # it logs after pytest has closed its capture
    register(session)
    yield session
    session.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    """moto's S3 server for the whole session, with one bucket."""
    moto = MotoS3().start().create_bucket()
    yield moto
    moto.stop()
