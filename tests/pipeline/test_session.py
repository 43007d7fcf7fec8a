"""`app.pipeline.session`: a script run with the project's interpreter works though `python3` on PATH
(what Spark's workers run by default) lacks pyarrow and Rill."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.pipeline.conftest import Cold

SCRIPT = textwrap.dedent(
    """
    from app.pipeline import session

    spark = session("session-test", "local[1]")
    df = spark.read.format("rill").options(store={store!r}, bucket="b1", stream="orders", include_hot="false").load()
    print("rows", df.count())
    print("python", spark.conf.get("spark.pyspark.python"))
    spark.stop()
    """
)


def test_a_script_with_the_session_helper_runs_its_workers_on_this_interpreter(file_cold: Cold) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV")}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"  # as a fresh shell: its python3 has no pyarrow
    script = SCRIPT.format(store=file_cold.options["store"])
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300, cwd=os.getcwd()
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"rows {len(file_cold.records[('b1', 'orders')])}" in done.stdout
    assert f"python {sys.executable}" in done.stdout
