"""`rill` command line: `rill serve` starts a node."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import uvicorn

from app.bench import cli as bench_cli
from app.cluster import cli as cluster_cli
from app.config import load_settings, parse_peers
from app.pipeline import cli as pipeline_cli
from app.security import cli as token_cli
from app.server import create_app


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
    serve.add_argument("--node-id", type=int, help="this node's id in --peers")
    serve.add_argument("--peers", type=parse_peers, help="1=http://127.0.0.1:4437,2=...,3=... (all voters)")
    serve.add_argument("--cluster-secret", help="shared secret signing Raft messages between nodes")
    serve.add_argument(
        "--cluster-secret-file", type=Path, help="read the cluster secret from this file (keeps it out of `ps`)"
    )
    serve.add_argument("--tls-cert", type=Path, help="PEM certificate chain: serve HTTPS to clients and peers")
    serve.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    serve.add_argument("--tls-ca", type=Path, help="PEM CA bundle verifying https:// peers (default: system CAs)")
    serve.add_argument("--auth", choices=("on", "off"), help="on: data routes need a bearer token with a scope")
    serve.add_argument("--public-url", help="this node's URL as clients see it, for Location headers")
    serve.add_argument(
        "--cors-origin", action="append", dest="cors_origins", help="an origin browsers may call from (repeatable)"
    )
    serve.add_argument("--forward-writes", action="store_true", default=None, help="followers proxy writes")
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

    if args.command == "serve":
        settings = load_settings(
            args.config,
            host=args.host,
            port=args.port,
            data_dir=args.data_dir,
            long_poll_timeout=args.long_poll_timeout,
            max_body_bytes=args.max_body_bytes,
            access_log=args.access_log,
            node_id=args.node_id,
            peers=args.peers,
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
        if args.auth is not None:  # the mode alone: the [auth] table's tokens and JWT settings stay
            settings.auth = settings.auth.model_copy(update={"mode": args.auth})
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        uvicorn.run(
            create_app(settings),
            host=settings.host,
            port=settings.port,
            loop="uvloop",
            http="httptools",
            access_log=settings.access_log,
            log_level="info",
            timeout_graceful_shutdown=5,
            proxy_headers=False,
            server_header=False,
            ssl_certfile=settings.tls_cert,
            ssl_keyfile=settings.tls_key,
        )


if __name__ == "__main__":
    main()
