"""`rill pipeline export`: a Parquet dataset partitioned by bucket/stream/date, a summary, clear errors."""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest

from app.domain.offsets import format_offset
from app.pipeline.cli import add_parser, main, read_options
from app.pipeline.export import export
from tests.pipeline.conftest import LAYOUT, Cold


def export_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rill")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["pipeline", "export", *argv])


def read_back(out: Path) -> dict[str, Any]:
    """The exported rows by stream, each in offset order."""
    table = ds.dataset(out, format="parquet", partitioning="hive").to_table()
    by_stream: dict[str, Any] = {}
    for stream in pc.unique(table["stream"]).to_pylist():
        rows = table.filter(pc.equal(table["stream"], stream)).sort_by("offset")
        by_stream[stream] = rows
    return by_stream


def day(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).date().isoformat()


def test_export_writes_a_dataset_partitioned_by_bucket_stream_and_date(
    spark: Any, file_cold: Cold, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(export_args("--store", file_cold.options["store"], "--bucket", "b1", "--out", str(out))) == 0

    want_dirs = set()
    for stream in LAYOUT["b1"]:
        for r in file_cold.records[("b1", stream)]:
            want_dirs.add(f"bucket=b1/stream={stream.replace('/', '%2F')}/date={day(r.time)}")
    got_dirs = {p.relative_to(out).as_posix() for p in out.glob("bucket=*/stream=*/date=*")}
    assert got_dirs == want_dirs
    assert "bucket=b1/stream=orders/date=2024-03-02" in got_dirs  # "orders" crosses midnight UTC

    exported = read_back(out)
    assert sorted(exported) == sorted(LAYOUT["b1"])
    for stream, rows in exported.items():
        records = file_cold.records[("b1", stream)]
        assert b"".join(rows["payload"].to_pylist()) == file_cold.payload("b1", stream)
        assert rows["offset"].to_pylist() == [format_offset(r.pos) for r in records]
        assert [str(d) for d in rows["date"].to_pylist()] == [day(r.time) for r in records]
        assert set(rows["bucket"].to_pylist()) == {"b1"}

    rows_total = sum(len(v) for k, v in file_cold.records.items() if k[0] == "b1")
    payload_total = sum(len(r.payload) for k, v in file_cold.records.items() if k[0] == "b1" for r in v)
    printed = capsys.readouterr().out
    assert f"exported {rows_total:,} rows, {payload_total:,} bytes of payload from 8 segments" in printed


def test_export_from_s3_takes_credentials_from_the_environment(
    spark: Any, s3_cold: Cold, moto_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    records = s3_cold.records[("b1", "logs/app")]
    out = tmp_path / "out"
    argv = ["--store", s3_cold.options["store"], "--bucket", "b1", "--stream", "logs/app", "--out", str(out)]
    argv += ["--s3-endpoint-url", moto_url, "--region", "us-east-1", "--from-offset", format_offset(records[2].pos)]
    args = export_args(*argv)
    # Passed as options, so executors on other hosts get them too.
    assert read_options(args)["access_key_id"] == "testing"
    assert main(args) == 0
    (rows,) = read_back(out).values()
    assert b"".join(rows["payload"].to_pylist()) == s3_cold.payload("b1", "logs/app", lo=records[2].pos)


def test_export_reports_progress_until_every_task_is_done(spark: Any, file_cold: Cold, tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    summary = export(spark, file_cold.opts(prefix="logs/"), str(tmp_path / "out"), progress=lambda *a: seen.append(a))
    assert summary.segments == 3
    assert summary.rows == 12
    assert seen and seen[-1][0] == seen[-1][1] >= 3


def test_export_refuses_bad_arguments(spark: Any, file_cold: Cold, tmp_path: Path, capsys: Any) -> None:
    args = export_args(
        "--store", file_cold.options["store"], "--bucket", "b1", "--out", str(tmp_path / "o"), "--from-offset", "zzz"
    )
    assert main(args) == 2
    assert "option 'from_offset' must be an offset token" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    args = export_args("--store", file_cold.options["store"], "--bucket", "b1", "--out", str(taken))
    assert main(args) == 2  # --mode errorifexists by default
    assert "already exists" in capsys.readouterr().err
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]
    with pytest.raises(SystemExit):  # --stream and --prefix exclude each other
        export_args("--store", "file:///x", "--bucket", "b", "--out", "o", "--stream", "s", "--prefix", "p")
