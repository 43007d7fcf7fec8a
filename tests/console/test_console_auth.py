"""The console against a server with auth on: a 401 tells the user to enter a token; with one, the
console lists, tails (SSE over fetch, with the Authorization header) and appends."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Page, expect

from app.security.tokens import new_token, toml_entry
from tests.console.conftest import Console, needs_chromium
from tests.server import RillProcess

pytestmark = needs_chromium

ADMIN = new_token()
READER = new_token()
BUCKET = "secure-ops"
STREAM = "deploys"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RillProcess]:
    root = tmp_path_factory.mktemp("console-auth")
    config = root / "rill.toml"
    config.write_text(
        toml_entry(ADMIN, ["admin:*"], "console-admin") + toml_entry(READER, ["read:*"], "console-reader")
    )
    rill = RillProcess(root / "data", None, "--auth", "on", "--config", str(config)).start()
    admin = {"authorization": f"Bearer {ADMIN}"}
    with httpx.Client(base_url=rill.url, timeout=10, headers=admin) as http:
        assert http.put(f"/ds/{BUCKET}").status_code == 201
        assert http.put(f"/ds/{BUCKET}/{STREAM}", headers={"content-type": "application/json"}).status_code == 201
    yield rill
    rill.stop()


def _open(page: Page, server: RillProcess) -> None:
    page.goto(server.url + "/console/")
    expect(page.locator("body")).to_have_attribute("data-ready", "true")


def _use_token(page: Page, token: str) -> None:
    page.fill("#token", token)
    page.click("#token-form button[type=submit]")


def test_without_a_token_the_console_says_401(console: Console, server: RillProcess) -> None:
    page = console.page
    _open(page, server)
    status = page.locator("#status")
    expect(status).to_contain_text("401")
    expect(status).to_contain_text("enter a token in the header bar")
    expect(page.locator("#bucket-list button.item")).to_have_count(0)
    page.click("#tab-cluster")
    expect(page.locator("#cluster-note")).to_contain_text("admin token")
    assert [e for e in console.errors if "uncaught" in e] == []


def test_with_an_admin_token_it_lists_tails_and_appends(console: Console, server: RillProcess) -> None:
    page = console.page
    _open(page, server)
    expect(page.locator("#status")).to_contain_text("401")
    console.errors.clear()  # the first listing, without a token
    _use_token(page, ADMIN)
    page.locator("#bucket-list button.item", has_text=BUCKET).click()
    page.locator("#stream-list button.item", has_text=STREAM).click()
    expect(page.locator("#stream-type")).to_have_text("application/json")
    page.select_option("#tail-from", "now")
    page.click("#tail-start")
    expect(page.locator("#tail-state")).to_have_text("live")

    page.fill("#append-body", json.dumps({"service": "checkout", "version": "2.4.1"}))
    page.click("#append-send")
    admin = {"authorization": f"Bearer {ADMIN}"}
    outside = httpx.post(
        f"{server.url}/ds/{BUCKET}/{STREAM}", json={"service": "search", "version": "9.0"}, headers=admin
    )
    assert outside.status_code == 204
    log = page.locator("#tail-log")
    expect(log).to_contain_text('"version": "2.4.1"')
    expect(log).to_contain_text('"service": "search"')

    page.reload()  # the token stays for the tab (sessionStorage), and is never shown
    expect(page.locator("#bucket-list button.item", has_text=BUCKET)).to_be_visible()
    assert page.locator("#token").get_attribute("type") == "password"
    page.click("#tab-cluster")
    expect(page.locator("#cluster-nodes")).to_contain_text("leader")
    page.click("#tab-tiering")
    expect(page.locator("#tiering-state")).to_contain_text("file://")
    assert console.unexpected_errors("/snapshot") == []


def test_a_read_only_token_sees_403_on_append(console: Console, server: RillProcess) -> None:
    page = console.page
    _open(page, server)
    _use_token(page, READER)
    page.locator("#bucket-list button.item", has_text=BUCKET).click()
    page.locator("#stream-list button.item", has_text=STREAM).click()
    page.fill("#append-body", '{"service": "nope"}')
    page.click("#append-send")
    expect(page.locator("#status")).to_contain_text("403")
    page.click("#token-clear")
    expect(page.locator("#status")).to_contain_text("401")
    expect(page.locator("#bucket-list button.item")).to_have_count(0)
    assert [e for e in console.errors if "uncaught" in e] == []
