"""Settings: defaults, overridden by a TOML file, then by RILL_* environment variables, then by flags."""

from __future__ import annotations

import ipaddress
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict

from app.raft.messages import MAX_NODE_ID, parse_node_id
from app.security.authenticator import AuthSettings
from app.security.quotas import BucketQuota


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RILL_", env_nested_delimiter="__", extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(4437, ge=0, le=65535)
    data_dir: Path = Path("./data")
    node_id: int = Field(1, ge=1, le=MAX_NODE_ID)
    peers: dict[int, str] = Field(default_factory=dict, description="node id -> base URL; empty: a single node")
    peer_routes: dict[int, str] = Field(
        default_factory=dict,
        description="node id -> URL this node dials that peer at instead of its member URL (a proxy, sidecar or NAT"
        " in between); clients and redirects still get the member URL",
    )
    cluster_secret: str = Field("", description="shared by the nodes; signs their Raft messages")
    peer_channels: bool = Field(
        True, description="send Raft messages over a framed channel per peer (HTTP POST where a peer refuses)"
    )
    cluster_secret_file: Path | None = Field(None, description="read the cluster secret from this file")
    forward_writes: bool = Field(
        True, description="followers proxy writes to the leader; false: they answer 307 to the leader's URL"
    )
    unsafe_test_fault: Literal["", "commit-alone", "read-without-barrier"] = Field(
        "",
        description="TEST ONLY, never in production: breaks a safety rule on purpose (a leader commits without a"
        " majority; a follower reads without the ReadIndex barrier) so `rill bench chaos` can show it catches it",
    )
    join: bool = Field(False, description="a new node outside --peers, waiting to be added with `rill cluster add`")
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1, description="largest request body (413 past it)")
    body_budget_bytes: int = Field(
        256 * 1024 * 1024, ge=1, description="request bodies held at once by all requests together (503 past it)"
    )
    bucket_quota: BucketQuota = Field(
        default_factory=lambda: BucketQuota(),
        description="each bucket's quota unless bucket_quotas names it (429 past it)",
    )
    bucket_quotas: dict[str, BucketQuota] = Field(default_factory=dict, description="bucket -> its own quota")
    # The HTTP edge (app/serving): what one connection may hold before the app sees a request.
    max_header_bytes: int = Field(64 * 1024, ge=1024, description="request line and headers, at most (431 past it)")
    header_timeout: float = Field(10.0, gt=0, description="seconds from a request's first byte to its headers' end")
    keepalive_timeout: float = Field(5.0, gt=0, description="seconds a connection may idle, before or between requests")
    body_timeout: float = Field(30.0, gt=0, description="seconds a body may go without a byte (408 past it)")
    body_min_rate: float = Field(
        1024.0, ge=0, description="bytes/s a body must average once it has taken body_timeout seconds; 0: off"
    )
    max_connections: int | None = Field(
        None, ge=1, description="open client connections (503 past it); unset: what the fd limit leaves past fd_reserve"
    )
    max_connections_per_client: int | None = Field(
        None,
        ge=0,
        description="open connections from one client IP address (IPv6: one /64; the cluster's nodes are exempt;"
        " 503 past it); unset: a quarter of max_connections; 0: no per-client limit (e.g. behind a proxy)",
    )
    fd_reserve: int = Field(256, ge=0, description="file descriptors kept from clients for RocksDB, peers, cold store")
    read_chunk_bytes: int = Field(1024 * 1024, ge=1024)
    snapshot_max_bytes: int = Field(64 * 1024 * 1024, ge=1, description="largest published snapshot (413 past it)")
    bootstrap_max_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="messages a bootstrap returns at most")
    long_poll_timeout: float = Field(20.0, gt=0, description="seconds a long-poll waits for data")
    sse_max_seconds: float = Field(60.0, gt=0, description="an SSE response ends after about this long")
    sse_ping_seconds: float = Field(15.0, gt=0, description="heartbeat comment interval on SSE")
    sse_buffer_bytes: int = Field(
        1 << 20, ge=64 << 10, description="unsent bytes an SSE subscriber may fall behind by before it is disconnected"
    )
    tail_cache_bytes: int = Field(
        64 << 20, ge=0, description="recently appended records kept in memory for live readers, all streams; 0: off"
    )
    tail_stream_bytes: int = Field(4 << 20, ge=1, description="of which one stream keeps at most")
    raft_tick_seconds: float = Field(0.1, gt=0)
    raft_compact_entries: int = Field(20_000, ge=10, description="applied entries between log compactions")
    raft_compact_keep: int = Field(5_000, ge=0, description="entries a cluster keeps behind a compaction")
    access_log: bool = False
    log_format: Literal["text", "json"] = Field("text", description="json: one JSON object per log line")
    cold_store: str = Field("", description="s3://bucket/prefix or file:///dir; empty: file store in <data_dir>/cold")
    s3_endpoint_url: str | None = Field(None, description="S3 endpoint (MinIO, moto); unset: AWS")
    s3_region: str | None = None
    s3_path_style: bool | None = Field(None, description="path-style addressing; default: on with an endpoint URL")
    segment_max_bytes: int = Field(8 << 20, ge=1, description="a segment is sealed at this size")
    segment_max_age: float = Field(60.0, gt=0, description="seconds after its first byte a segment is sealed")
    pack_below_bytes: int = Field(1 << 20, ge=0, description="streams sealing less share a pack per bucket; 0: never")
    merge_min_segments: int = Field(16, ge=2, description="a stream's small segments are merged once it has this many")
    local_disk_budget: int = Field(1 << 30, ge=0, description="bytes of tiered records kept on local disk")
    hot_backlog_budget: int = Field(2 << 30, ge=1, description="untiered bytes past which appends answer 503")
    cold_cache_bytes: int = Field(64 << 20, ge=1 << 20, description="segments kept in memory for cold reads")
    tiering_interval: float = Field(0.5, gt=0, description="seconds between tiering passes")
    # The leader's backups of the applied state to the cold store (app/tiering/backups.py).
    state_checkpoint_interval: float = Field(60.0, gt=0, description="most seconds between state backups")
    state_checkpoint_entries: int = Field(10_000, ge=1, description="applied entries that make a backup due sooner")
    state_checkpoint_keep: int = Field(3, ge=1, description="newest state backups kept in the cold store")
    # Free space on the data directory's filesystem (app/storage/disk.py): writes that add data answer
    # 507 while it is below the watermark, min(disk_min_free_bytes, disk_min_free_ratio x filesystem size).
    disk_min_free_bytes: int = Field(1 << 30, ge=0, description="watermark cap in bytes (default 1 GiB); 0: off")
    disk_min_free_ratio: float = Field(0.05, ge=0, le=1, description="watermark as a share of the filesystem; 0: off")
    disk_ballast_bytes: int = Field(
        64 << 20, ge=0, description="reserve file <data_dir>/ballast, freed when the disk fills; max(1%, 1 MiB) at most"
    )
    auth: AuthSettings = Field(default_factory=lambda: AuthSettings())
    cors_origins: list[str] = Field(
        default_factory=list, description="origins whose pages may write (and read with tokens); * for any"
    )
    public_url: str | None = Field(
        None,
        description="this node's URL as clients see it, for Location headers and subscriptions' callback and JWKS"
        " URLs; unset: its --peers URL, else http(s)://host:port it listens on (never the request's Host)",
    )
    webhook_allowed_networks: list[str] = Field(
        default_factory=list,
        description="networks (CIDR) webhooks may reach besides public addresses, e.g. 127.0.0.1/32 for tests",
    )
    tls_cert: Path | None = Field(None, description="PEM certificate chain: serve HTTPS")
    tls_key: Path | None = Field(None, description="PEM private key of --tls-cert")
    tls_ca: Path | None = Field(None, description="PEM CA bundle to verify peers' certificates (default: system)")

    @field_validator("webhook_allowed_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for network in value:
            ipaddress.ip_network(network, strict=False)  # a ValueError names the bad one
        return value

    @field_validator("auth", mode="before")
    @classmethod
    def _auth_mode(cls, value: Any) -> Any:
        return {"mode": value} if isinstance(value, str) else value  # `auth = "on"` in TOML


def parse_peers(text: str) -> dict[int, str]:
    """`1=http://127.0.0.1:4437,2=http://127.0.0.1:4438` -> {1: ..., 2: ...} (also --peer-routes)."""
    peers: dict[int, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        node_id, sep, url = item.partition("=")
        peer = parse_node_id(node_id.strip())
        if not sep or peer is None or not url.strip():
            raise ValueError(f"peers must look like 1=http://host:port,2=...; got {item!r}")
        peers[peer] = url.strip().rstrip("/")
    return peers


def _merge(into: dict[str, Any], values: dict[str, Any]) -> None:
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    values: dict[str, Any] = {}
    if config_file is not None:
        with open(config_file, "rb") as fh:
            values.update(tomllib.load(fh))
    # Flags win over the environment, which wins over the file (a table key by key: RILL_AUTH__MODE
    # sets the mode and keeps the file's [auth] tokens). Passed to Settings, the file's values would
    # win over the environment as every keyword does.
    _merge(values, EnvSettingsSource(Settings)())
    values.update({k: v for k, v in overrides.items() if v is not None})
    settings = Settings(**values)
    if settings.cluster_secret_file is not None:
        settings.cluster_secret = settings.cluster_secret_file.read_text().strip()
        if not settings.cluster_secret:
            raise ValueError(f"the cluster secret file {settings.cluster_secret_file} is empty")
    if settings.body_budget_bytes < settings.max_body_bytes:
        raise ValueError(
            f"body_budget_bytes ({settings.body_budget_bytes}) must be at least "
            f"max_body_bytes ({settings.max_body_bytes})"
        )
    if (settings.tls_cert is None) != (settings.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    if settings.peers:
        if settings.join and settings.node_id in settings.peers:
            raise ValueError(f"a joining node {settings.node_id} must not be among the peers it joins")
        if not settings.join and settings.node_id not in settings.peers:
            raise ValueError(
                f"node {settings.node_id} is not among the peers {sorted(settings.peers)} (use --join for a new node)"
            )
        if not settings.cluster_secret:
            raise ValueError("a cluster needs --cluster-secret (or RILL_CLUSTER_SECRET) on every node")
    return settings
