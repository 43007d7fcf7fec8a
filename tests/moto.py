"""moto's S3 server (a real HTTP S3 API) on 127.0.0.1, for the cold tier and pipeline tests."""

from __future__ import annotations

import uuid
from typing import Any

import boto3
from moto.server import ThreadedMotoServer

from app.tiering.store import S3Store, StoreOptions
from tests.server import free_port

CREDENTIALS = {"access_key_id": "test", "secret_access_key": "test", "region": "us-east-1"}


class MotoS3:
    """One server and one bucket. It can stop and start again on the same port: moto keeps the
    objects in this process meanwhile. Credentials travel in `options`, never in the environment."""

    def __init__(self, bucket: str = "rill-cold-tests") -> None:
        self.port = free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self.bucket = bucket
        self.options = StoreOptions(endpoint_url=self.endpoint_url, read_timeout=10, **CREDENTIALS)
        self.server: ThreadedMotoServer | None = None

    def start(self) -> MotoS3:
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def create_bucket(self) -> MotoS3:
        self.client().create_bucket(Bucket=self.bucket)
        return self

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

    def keys(self, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]
