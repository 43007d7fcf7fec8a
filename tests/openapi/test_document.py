"""The OpenAPI document: valid OpenAPI 3.1, and served verbatim by the server."""

from __future__ import annotations

import httpx
import yaml
from openapi_spec_validator import validate

from tests.openapi.helpers import OPENAPI, load_document


def test_document_is_valid_openapi() -> None:
    document = load_document()
    assert document["openapi"].startswith("3.1")
    validate(document)  # raises on any violation of the OpenAPI 3.1 schema


def test_server_serves_the_document(client: httpx.Client) -> None:
    response = client.get("/openapi.yaml")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/yaml")
    assert response.content == OPENAPI.read_bytes()
    assert yaml.safe_load(response.content) == load_document()
