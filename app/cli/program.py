"""`rill` command line: `rill serve` starts a node; data.py and cluster.py hold the other commands."""

from __future__ import annotations

import argparse
import logging
import os
import ssl
import sys
import tomllib
from pathlib import Path
from typing import NoReturn

import uvicorn
from pydantic import ValidationError

from app.bench import cli as bench_cli
from app.cli import cluster as cluster_cli
from app.cli import data as commands
from app.cli import restore as restore_cli
from app.config import Settings, load_settings, parse_peers
from app.counters.counts import RequestCounters
from app.observability import logs
from app.pipeline import cli as pipeline_cli
from app.runtime import blocking
from app.security import cli as token_cli
from app.server import create_app
from app.serving.connection import EdgeProtocol, protocol_for
from app.serving.limits import EdgeLimits, plan_limits


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="rill", description="Rill durable streams server")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start a node")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--data-dir", type=Path)
    serve.add_argument("--config", type=Path, help="TOML file with settings")
    serve.add_argument("--long-poll-timeout", type=float, help="seconds a long-poll waits (default 20)")
    serve.add_argument("--max-body-bytes", type=int)
    serve.add_argument("--access-log", action="store_true", default=None)
    serve.add_argument("--log-format", choices=("text", "json"), help="json: one JSON object per line")
    serve.add_argument("--node-id", type=int, help="this node's id in --peers")
    serve.add_argument("--peers", type=parse_peers, help="1=http://127.0.0.1:4437,2=...,3=... (all voters)")
    serve.add_argument(
        "--peer-routes", type=parse_peers, help="2=http://proxy:9002,...: dial these peers here (default: --peers)"
    )
    serve.add_argument("--cluster-secret", help="shared secret signing Raft messages between nodes")
    serve.add_argument(
        "--cluster-secret-file", type=Path, help="read the cluster secret from this file (keeps it out of `ps`)"
    )
    serve.add_argument("--tls-cert", type=Path, help="PEM certificate chain: serve HTTPS to clients and peers")
    serve.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    serve.add_argument("--tls-ca", type=Path, help="PEM CA bundle verifying https:// peers (default: system CAs)")
    serve.add_argument("--auth", choices=("on", "off"), help="on: data routes need a bearer token with a scope")
    serve.add_argument("--public-url", help="this node's URL as clients see it, for Location headers and callback URLs")
    serve.add_argument(
        "--cors-origin", action="append", dest="cors_origins", help="an origin browsers may call from (repeatable)"
    )
    serve.add_argument(
        "--forward-writes",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="followers proxy writes to the leader (the default); --no-forward-writes: they answer 307",
    )
    serve.add_argument(
        "--join", action="store_true", default=None, help="start outside --peers and wait for `rill cluster add`"
    )
    serve.add_argument("--cold-store", help="s3://bucket/prefix or file:///dir (default: file store in data/cold)")
    serve.add_argument("--s3-endpoint-url", help="S3 endpoint URL, e.g. http://127.0.0.1:9000 for MinIO")
    serve.add_argument("--segment-max-bytes", type=int, help="seal a segment at this size (default 8 MiB)")
    serve.add_argument("--segment-max-age", type=float, help="seal a segment this many seconds after its first byte")
    serve.add_argument("--local-disk-budget", type=int, help="bytes of tiered data kept on local disk")
    serve.add_argument("--hot-backlog-budget", type=int, help="untiered bytes past which appends answer 503")
    bench_cli.add_parser(sub)
    cluster_cli.add_parser(sub)
    pipeline_cli.add_parser(sub)
    token_cli.add_parser(sub)
    restore_cli.add_parser(sub)
    commands.add_parsers(sub)
    args = parser.parse_args(argv)

    if args.command == "bench":
        bench_cli.main(args)
        return
    if args.command == "cluster":
        cluster_cli.main(args)
        return
    if args.command == "pipeline":
        raise SystemExit(pipeline_cli.main(args))
    if args.command == "token":
        token_cli.main(args)
        return
    if args.command == "restore":
        restore_cli.main(args)
        return
    if args.command in commands.NAMES:
        raise SystemExit(commands.main(args))

    if args.command == "serve":
        try:
            settings = load_settings(
                args.config,
                host=args.host,
                port=args.port,
                data_dir=args.data_dir,
                long_poll_timeout=args.long_poll_timeout,
                max_body_bytes=args.max_body_bytes,
                access_log=args.access_log,
                log_format=args.log_format,
                node_id=args.node_id,
                peers=args.peers,
                peer_routes=args.peer_routes,
                cluster_secret=args.cluster_secret,
                cluster_secret_file=args.cluster_secret_file,
                tls_cert=args.tls_cert,
                tls_key=args.tls_key,
                tls_ca=args.tls_ca,
                public_url=args.public_url,
                cors_origins=args.cors_origins,
                forward_writes=args.forward_writes,
                join=args.join,
                cold_store=args.cold_store,
                s3_endpoint_url=args.s3_endpoint_url,
                segment_max_bytes=args.segment_max_bytes,
                segment_max_age=args.segment_max_age,
                local_disk_budget=args.local_disk_budget,
                hot_backlog_budget=args.hot_backlog_budget,
            )
            check_tls_files(settings)
            _usable_data_dir(settings.data_dir)
        except (ValueError, OSError) as exc:  # pydantic's ValidationError and TOMLDecodeError are ValueErrors
            config_error(exc)
        if args.auth is not None:  # the mode alone: the [auth] table's tokens and JWT settings stay
            settings.auth = settings.auth.model_copy(update={"mode": args.auth})
        logs.configure(settings.log_format)
        try:  # before the stores open: it raises the process's open-file limit
            edge = plan_limits(
                max_connections=settings.max_connections,
                fd_reserve=settings.fd_reserve,
                max_connections_per_client=settings.max_connections_per_client,
                header_timeout=settings.header_timeout,
                keepalive_timeout=settings.keepalive_timeout,
                body_timeout=settings.body_timeout,
                body_min_rate=settings.body_min_rate,
                max_header_bytes=settings.max_header_bytes,
            )
        except ValueError as exc:
            raise SystemExit(f"rill: {exc}") from None
        requests = RequestCounters()
        protocol = protocol_for(edge, requests)
        try:
            _serve(settings, edge, protocol, requests)
        finally:
            leave_stuck_calls()


def _serve(settings: Settings, edge: EdgeLimits, protocol: type[EdgeProtocol], requests: RequestCounters) -> None:
    uvicorn.run(
        create_app(settings, clients=protocol.clients, requests=requests),
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http=protocol,
        ws="none",
        backlog=edge.backlog,
        access_log=settings.access_log,
        log_level="info",
        log_config=None,  # logs.configure set the format
        timeout_graceful_shutdown=5,
        proxy_headers=False,
        server_header=False,
        ssl_certfile=settings.tls_cert,
        ssl_keyfile=settings.tls_key,
    )


def leave_stuck_calls() -> None:
    """Exits now if blocking calls are still running once the server has stopped (a stalled object
    store, say): Python joins every pool thread at exit, and Ctrl-C then waited for their timeouts."""
    stuck = blocking.running()
    if not stuck:
        return
    exc = sys.exc_info()[1]
    code = 0 if exc is None else 130 if isinstance(exc, KeyboardInterrupt) else 1
    if isinstance(exc, SystemExit):
        code = exc.code if isinstance(exc.code, int) else 1
    logging.getLogger("rill.server").warning("exiting with %d blocking call(s) still running", stuck)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def config_error(exc: Exception) -> NoReturn:
    """A configuration error is the user's to fix, not a crash: one line on stderr, exit status 2."""
    message = " ".join(_describe(exc).split())  # one line, whatever the exception's text held
    print(f"rill: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _describe(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        problems = [
            f"{'.'.join(str(part) for part in e['loc']) or 'settings'}: "
            + ("unknown setting" if e["type"] == "extra_forbidden" else e["msg"])
            for e in exc.errors()  # no input values: they could be secrets
        ]
        return "invalid settings: " + "; ".join(problems)
    if isinstance(exc, tomllib.TOMLDecodeError):
        return f"the --config file is not valid TOML: {exc}"
    if isinstance(exc, UnicodeDecodeError):
        return "a settings file (--config, --cluster-secret-file) is not UTF-8 text"
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"cannot read {exc.filename}: {exc.strerror}"
    return str(exc)


def _usable_data_dir(path: Path) -> None:
    """A ValueError (one line, not a traceback) when the directory could not be made: a file is there
    or on its way. Nothing is made yet: nothing may start before the configuration is valid."""
    existing = next(p for p in (path, *path.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"--data-dir {path} cannot be used: {existing} is not a directory")


class _EncryptedKey(Exception):
    pass


def _no_prompt() -> str:
    raise _EncryptedKey


def check_tls_files(settings: Settings) -> None:
    """Loads the TLS files as the server will, so that a bad one is a configuration error here rather
    than a traceback from uvicorn once the stores are open."""
    files = {"--tls-cert": settings.tls_cert, "--tls-key": settings.tls_key, "--tls-ca": settings.tls_ca}
    for flag, path in files.items():
        if path is not None:
            try:
                path.open("rb").close()
            except OSError as exc:
                raise ValueError(f"{flag} {path}: {exc.strerror}") from None
    cert, key = settings.tls_cert, settings.tls_key
    if cert is not None and key is not None:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key, password=_no_prompt)
        except _EncryptedKey:
            pass  # a password-protected key: uvicorn prompts for its password, as it always has
        except ssl.SSLError as exc:
            detail = f" ({exc.reason.lower().replace('_', ' ')})" if exc.reason else ""
            raise ValueError(
                f"--tls-cert {cert} and --tls-key {key} are not a PEM certificate and its key{detail}"
            ) from None
    if settings.tls_ca is not None:
        try:
            ssl.create_default_context(cafile=str(settings.tls_ca))
        except ssl.SSLError:
            raise ValueError(f"--tls-ca {settings.tls_ca} holds no PEM certificate") from None
