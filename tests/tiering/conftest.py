"""Fixtures of the cold-tier tests: one moto S3 server on 127.0.0.1 for the whole session."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from app.tiering.store import S3Store, StoreOptions
from tests.server import free_port


@dataclass
class MotoS3:
    """moto's S3 HTTP server with one bucket; credentials travel in `options`, never in the environment."""

    server: ThreadedMotoServer
    port: int
    endpoint_url: str
    bucket: str
    options: StoreOptions

    def client(self) -> Any:
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id="test",
            aws_secret_access_key="test",
            region_name="us-east-1",
        )

    def store(self, prefix: str | None = None) -> S3Store:
        """A store under a fresh prefix (or the one given), so tests never see each other's objects."""
        return S3Store(self.bucket, f"t-{uuid.uuid4().hex[:12]}" if prefix is None else prefix, self.options)

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        """Starts serving again on the same port; moto keeps its objects in this process meanwhile."""
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    options = StoreOptions(
        endpoint_url=endpoint, access_key_id="test", secret_access_key="test", region="us-east-1", read_timeout=10
    )
    moto = MotoS3(server, port, endpoint, "rill-cold-tests", options)
    moto.client().create_bucket(Bucket=moto.bucket)
    try:
        yield moto
    finally:
        moto.server.stop()
