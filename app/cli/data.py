"""The data commands of `rill`, for people: buckets, streams, create, append, read, tail, close,
delete. Each subcommand's parser sets `run`, which `main` calls.

Output rules: stream data and listings go to stdout, notes and progress to stderr; a failure is one
line on stderr (`rill: error: ...`) and exit status 1 (2 for usage errors), never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

import httpx

from app.cli import append, buckets, lifecycle, read, streams, subs, tail
from app.cli.client import CliError, add_connection_args

NAMES = ("buckets", "streams", "create", "close", "delete", "append", "read", "tail", "subs")


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    buckets.add_parser(sub, add_connection_args)
    streams.add_parser(sub, add_connection_args)
    lifecycle.add_parsers(sub, add_connection_args)
    append.add_parser(sub, add_connection_args)
    read.add_parser(sub, add_connection_args)
    tail.add_parser(sub, add_connection_args)
    subs.add_parser(sub, add_connection_args)


def main(args: argparse.Namespace) -> int:
    """Runs the parsed command; returns the exit status."""
    try:
        status: int = args.run(args)
        return status
    except CliError as exc:
        print(f"rill: error: {exc}", file=sys.stderr)
        return exc.status
    except httpx.HTTPError as exc:  # the connection failed while a body was being read
        print(
            f"rill: error: the connection failed: {' '.join(str(exc).split()) or type(exc).__name__}", file=sys.stderr
        )
        return 1
    except ValueError as exc:  # an answer that is not what the protocol says (a proxy's page, say)
        print(f"rill: error: unexpected answer from the server: {' '.join(str(exc).split())[:200]}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader of our stdout went away (`rill read ... | head`)
        _silence_stdout()
        return 0


def _silence_stdout() -> None:
    """Points stdout at /dev/null, so that the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
