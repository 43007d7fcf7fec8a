"""`rill restore`: rebuild a node's data directory from the object store (app/service/restore.py)."""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
from pathlib import Path

from app.service.restore import RestoreError, restore
from app.tiering.store import StoreOptions, StoreUnavailable, open_store


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "restore",
        help="rebuild a data directory from the object store's state backups and segments",
        description="Builds --data-dir from the newest state backup in the cold store (or the newest at or "
        "before --at) and the segments sealed after it. Start it with `rill serve --data-dir D --cold-store "
        "SOURCE` (the same store: its segments hold the tiered records): it is a new one-node cluster; add "
        "nodes with `rill cluster add`.",
    )
    parser.add_argument(
        "--from", dest="source", required=True, help="the cold store: s3://bucket/prefix or file:///dir"
    )
    parser.add_argument("--data-dir", type=Path, required=True, help="an empty directory for the restored node")
    parser.add_argument("--at", help="a Raft index, or a time (ISO 8601, e.g. 2026-11-26T10:00:00Z)")
    parser.add_argument("--s3-endpoint-url", help="S3 endpoint URL, e.g. http://127.0.0.1:9000 for MinIO")
    parser.add_argument("--s3-region")
    parser.add_argument("--s3-path-style", action=argparse.BooleanOptionalAction, default=None)


def parse_at(text: str | None) -> tuple[int | None, int | None]:
    """(index, time in ms) from --at: digits are an index, anything else an ISO 8601 time."""
    if text is None:
        return None, None
    if text.isdigit():
        return int(text), None
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise SystemExit(f"rill restore: --at {text!r} is neither an index nor an ISO 8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return None, int(moment.timestamp() * 1000)


def main(args: argparse.Namespace) -> None:
    at_index, at_time = parse_at(args.at)
    options = StoreOptions(endpoint_url=args.s3_endpoint_url, region=args.s3_region, path_style=args.s3_path_style)
    try:
        store = open_store(args.source, options)
        done = restore(store, args.data_dir, at_index, at_time)
    except (RestoreError, StoreUnavailable, ValueError, OSError) as exc:  # OSError: a data dir it cannot use
        print(f"rill: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    when = datetime.datetime.fromtimestamp(done.created_at / 1000, datetime.UTC).isoformat(timespec="milliseconds")
    point = datetime.datetime.fromtimestamp(done.recovery_point / 1000, datetime.UTC).isoformat(timespec="milliseconds")
    print(f"restored {args.data_dir} from {done.key}")
    print(f"  state backup: index {done.index}, term {done.term}, taken {when}, {done.streams} streams")
    print(f"  sealed after it: {done.segments_after} segments, {done.records_after} appends, {done.bytes_after} bytes")
    print(f"  recovery point: {point} (every append acknowledged before it is restored; later ones only")
    print("  where a segment sealed after the backup holds them)")
    if done.newer_backups:
        print(f"  warning: {done.newer_backups} newer backups are in the store: only the newest's segments are kept")
        print("  for sure, so a range this one names may have been deleted since (reading it answers 503)")
    if done.new_streams:
        print(f"  {done.new_streams} streams created after the backup, brought back from their manifests")
    if done.unknown_streams:
        shown = ", ".join(done.unknown_streams[:10]) + (" ..." if len(done.unknown_streams) > 10 else "")
        print(f"  not restored: {len(done.unknown_streams)} forks created after the backup ({shown})")
    for problem in done.skipped[:10]:
        print(f"  skipped: {problem}")
    if len(done.skipped) > 10:
        print(f"  skipped: {len(done.skipped) - 10} more")
    print(f"start it with: {serve_command(args)}")


def serve_command(args: argparse.Namespace) -> str:
    """`rill serve` on the restored directory and the store restored from: the tiered records stay in
    its segments (the region and path style are settings, given as RILL_* variables)."""
    env = [f"RILL_S3_REGION={shlex.quote(args.s3_region)}"] if args.s3_region is not None else []
    if args.s3_path_style is not None:
        env.append(f"RILL_S3_PATH_STYLE={str(args.s3_path_style).lower()}")
    words = ["rill", "serve", "--data-dir", str(args.data_dir), "--cold-store", args.source]
    if args.s3_endpoint_url is not None:
        words += ["--s3-endpoint-url", args.s3_endpoint_url]
    return " ".join([*env, *map(shlex.quote, words)])
