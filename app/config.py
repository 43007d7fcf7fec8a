"""Settings: defaults, overridden by a TOML file, then by RILL_* environment variables, then by flags."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RILL_", extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(4437, ge=0, le=65535)
    data_dir: Path = Path("./data")
    node_id: int = Field(1, ge=1)
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1)
    read_chunk_bytes: int = Field(1024 * 1024, ge=1024)
    long_poll_timeout: float = Field(20.0, gt=0, description="seconds a long-poll waits for data")
    sse_max_seconds: float = Field(60.0, gt=0, description="an SSE response ends after about this long")
    sse_ping_seconds: float = Field(15.0, gt=0, description="heartbeat comment interval on SSE")
    raft_tick_seconds: float = Field(0.1, gt=0)
    access_log: bool = False


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    values: dict[str, Any] = {}
    if config_file is not None:
        with open(config_file, "rb") as fh:
            values.update(tomllib.load(fh))
    values.update({k: v for k, v in overrides.items() if v is not None})
    # Explicit values win over the environment; pydantic-settings reads RILL_* for the rest.
    return Settings(**values)
