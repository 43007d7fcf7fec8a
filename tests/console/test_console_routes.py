"""The console's routes and files, without a browser: headers, redirects, and pages the CSP holds for."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette

from app.console import CSP, STATIC, routes

CSP_TEXT = (
    "default-src 'self'; connect-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "frame-ancestors 'none'"
)


class Client:
    """GETs against an app of only the console's routes, over ASGI."""

    def __init__(self) -> None:
        self.app = Starlette(routes=routes())

    def get(self, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
        async def call() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://rill.test") as client:
                return await client.get(path, headers=headers)

        return asyncio.run(call())


@pytest.fixture(scope="module")
def client() -> Client:
    return Client()


@pytest.mark.parametrize("path", ["/console/", "/console"])
def test_the_console_page_is_html_with_a_strict_csp(client: Client, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert response.headers["content-security-policy"] == CSP == CSP_TEXT
    assert response.headers["x-frame-options"] == "DENY"
    assert "<title>Rill console</title>" in response.text


def test_root_redirects_to_the_console(client: Client) -> None:
    response = client.get("/")
    assert response.status_code == 307
    assert response.headers["location"] == "/console/"


@pytest.mark.parametrize(
    ("name", "media_type"),
    [
        ("console.js", "text/javascript; charset=utf-8"),
        ("api.js", "text/javascript; charset=utf-8"),
        ("console.css", "text/css; charset=utf-8"),
        ("favicon.svg", "image/svg+xml"),
    ],
)
def test_assets_have_their_types_and_the_same_headers(client: Client, name: str, media_type: str) -> None:
    response = client.get(f"/console/{name}")
    assert response.status_code == 200
    assert response.headers["content-type"] == media_type
    assert response.headers["content-security-policy"] == CSP
    again = client.get(f"/console/{name}", headers={"if-none-match": response.headers["etag"]})
    assert again.status_code == 304


def test_unknown_files_and_escapes_are_not_found(client: Client) -> None:
    assert client.get("/console/nope.js").status_code == 404
    assert client.get("/console/../__init__.py").status_code == 404
    assert client.get("/console/%2e%2e/__init__.py").status_code == 404


def test_no_inline_script_or_style_and_no_markup_from_data() -> None:
    """The CSP forbids inline code; the scripts build the DOM with textContent, never innerHTML."""
    html = (STATIC / "index.html").read_text()
    assert all("src=" in tag for tag in re.findall(r"<script\b[^>]*>", html)), "inline <script>"
    assert "<style" not in html and " style=" not in html and re.search(r"\son\w+=", html) is None
    for script in STATIC.glob("*.js"):
        source = script.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in source, f"{script.name} uses {sink}"
        assert ".style." not in source and 'setAttribute("style"' not in source, f"{script.name} sets styles"


def test_every_asset_the_page_names_exists() -> None:
    html = (STATIC / "index.html").read_text()
    named = re.findall(r'(?:src|href)="/console/([^"]+)"', html)
    imported = re.findall(r'from "\./([^"]+)"', (STATIC / "console.js").read_text())
    assert set(named) == {"favicon.svg", "console.css", "console.js"} and imported == ["api.js"]
    assert all(Path(STATIC / name).is_file() for name in [*named, *imported])
