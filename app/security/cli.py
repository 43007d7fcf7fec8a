"""`rill token create --scope write:acme [--name NAME] [--expires-at RFC3339]`.

Prints a new opaque token and the `[[auth.tokens]]` entry that admits it. Only the token's SHA-256
goes into the configuration: the token itself is shown once, here, and stored nowhere.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from app.security.scopes import ScopeError, parse_scopes
from app.security.tokens import new_token, toml_entry


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    token = sub.add_parser("token", help="make bearer tokens for `[auth]`")
    commands = token.add_subparsers(dest="token_command", required=True)
    create = commands.add_parser("create", help="print a new opaque token and the TOML entry that admits it")
    create.add_argument(
        "--scope",
        action="append",
        required=True,
        help="read, write or admin, optionally :bucket or :* (e.g. write:acme); repeat for more",
    )
    create.add_argument("--name", default="", help="who holds it, for logs and for you")
    create.add_argument("--expires-at", help="RFC 3339 with a time zone, e.g. 2027-01-01T00:00:00Z")


def expiry(value: str) -> str:
    """An RFC 3339 timestamp with a time zone, normalised to a TOML offset date-time."""
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValueError(
            f"--expires-at must be an RFC 3339 timestamp, e.g. 2027-01-01T00:00:00Z; got {value!r}"
        ) from None
    if when.tzinfo is None:
        raise ValueError("--expires-at needs a time zone, e.g. 2027-01-01T00:00:00Z")
    if when <= datetime.now(UTC):
        raise ValueError(f"--expires-at {value.strip()} has passed: the token would never work")
    return when.isoformat()


def main(args: argparse.Namespace) -> None:
    if args.token_command != "create":
        raise SystemExit(f"unknown token command {args.token_command!r}")
    try:
        parse_scopes(args.scope)
        expires_at = expiry(args.expires_at) if args.expires_at else None
    except (ScopeError, ValueError) as exc:
        print(f"rill token create: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    token = new_token()
    print(token)
    print()
    print(toml_entry(token, [s.strip() for s in args.scope], args.name, expires_at), end="")
    print(
        "\nThe first line is the token: give it to its holder now, it is not stored anywhere. "
        "Add the [[auth.tokens]] entry to the server's configuration file.",
        file=sys.stderr,
    )
