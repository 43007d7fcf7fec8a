"""The console in headless Chromium against a real `rill serve` (auth off).

The server ends SSE responses after a second, so the live tail reconnects from its last offset
during the tests, as it does after every `sse_max_seconds` in production.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.console.conftest import Console, needs_chromium, save_screenshot
from tests.server import RillProcess

pytestmark = needs_chromium

BUCKET = "acme-shop"
ORDERS = "orders"
HISTORY = [
    {"order_id": "A-1001", "customer": "Ada Lovelace", "total": 42.5, "currency": "EUR", "status": "paid"},
    {"order_id": "A-1002", "customer": "Grace Hopper", "total": 18.0, "currency": "USD", "status": "paid"},
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RillProcess]:
    root = tmp_path_factory.mktemp("console")
    rill = RillProcess(root / "data", None, env={"RILL_SSE_MAX_SECONDS": "1"}).start()
    with httpx.Client(base_url=rill.url, timeout=10) as http:
        _seed(http)
    yield rill
    rill.stop()


@pytest.fixture()
def http(server: RillProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


def _seed(http: httpx.Client) -> None:
    """A realistic bucket: JSON orders with attributes and a snapshot, a text log, binary frames."""
    assert http.put(f"/ds/{BUCKET}").status_code == 201
    json_type = {"content-type": "application/json"}
    for name in (ORDERS, "payments/eu-west", "payments/us-east", "carts"):
        assert http.put(f"/ds/{BUCKET}/{name}", headers=json_type).status_code == 201
    assert http.put(f"/ds/{BUCKET}/audit-log", headers={"content-type": "text/plain"}).status_code == 201
    binary = {"content-type": "application/octet-stream"}
    assert http.put(f"/ds/{BUCKET}/sensor/raw-frames", headers=binary).status_code == 201
    for message in HISTORY:
        response = http.post(f"/ds/{BUCKET}/{ORDERS}", headers=json_type, content=json.dumps(message))
        assert response.status_code == 204, response.text
    attrs = {"title": "Orders", "metadata": {"team": "shop", "schema": "order.v2"}}
    assert http.put(f"/ds/{BUCKET}/{ORDERS}/attrs", json=attrs).status_code == 204
    snapshot = {"open_orders": 2, "revenue": 60.5}
    offset = response.headers["stream-next-offset"]
    published = http.put(f"/ds/{BUCKET}/{ORDERS}/snapshot/{offset}", json=snapshot)
    assert published.status_code == 201, published.text


def _open(page: Page, server: RillProcess, path: str = "/") -> None:
    page.goto(server.url + path)
    expect(page.locator("body")).to_have_attribute("data-ready", "true")


def _open_stream(page: Page, bucket: str, stream: str) -> None:
    page.fill("#bucket-prefix", bucket[:4])
    page.click("#bucket-search button[type=submit]")
    page.locator("#bucket-list button.item", has_text=bucket).click()
    page.locator("#stream-list button.item").filter(has=page.get_by_text(stream, exact=True)).click()
    expect(page.locator("#stream-title")).to_have_text(stream)


def _start_tail(page: Page, origin: str) -> None:
    page.select_option("#tail-from", origin)
    page.click("#tail-start")
    expect(page.locator("#tail-state")).to_have_text("live")


def test_root_redirects_to_the_console_which_loads_cleanly(console: Console, server: RillProcess) -> None:
    page = console.page
    _open(page, server, "/")
    assert page.url == server.url + "/console/"
    assert page.title() == "Rill console"
    expect(page.locator("#bucket-list")).to_contain_text(BUCKET)
    expect(page.locator("#bucket-list")).to_contain_text("compat.v1")
    _open(page, server, "/console")  # without the slash too
    expect(page.locator("#bucket-list")).to_contain_text("legacy.streams")
    assert console.errors == []


def test_tail_a_json_stream_and_append_from_the_page_and_from_outside(
    console: Console, server: RillProcess, http: httpx.Client
) -> None:
    page = console.page
    _open(page, server)
    _open_stream(page, BUCKET, ORDERS)
    meta = page.locator("#stream-meta")
    expect(page.locator("#stream-type")).to_have_text("application/json")
    expect(meta).to_contain_text("Earliest offset")
    expect(page.locator("#stream-attrs")).to_contain_text('"team": "shop"')
    expect(page.locator("#stream-snapshot")).to_contain_text("sha256:")
    expect(page.locator("#snapshot-preview")).to_contain_text('"open_orders": 2')

    _start_tail(page, "-1")  # history first, then live
    log = page.locator("#tail-log")
    expect(log).to_contain_text('"customer": "Grace Hopper"')

    page.fill("#append-body", "{not json")
    page.click("#append-send")
    expect(page.locator("#status")).to_contain_text("not valid JSON")

    from_page = {"order_id": "A-1003", "customer": "Alan Turing", "total": 7.25, "currency": "GBP", "status": "new"}
    page.fill("#append-body", json.dumps(from_page))
    page.click("#append-send")
    expect(page.locator("#status")).to_contain_text("Appended to orders")
    expect(log).to_contain_text('"customer": "Alan Turing"')

    from_outside = {
        "order_id": "A-1004",
        "customer": "Edsger Dijkstra",
        "total": 31.0,
        "currency": "EUR",
        "status": "new",
    }
    assert http.post(f"/ds/{BUCKET}/{ORDERS}", json=from_outside).status_code == 204
    expect(log).to_contain_text('"customer": "Edsger Dijkstra"')

    time.sleep(1.5)  # the server ends the SSE response after 1 s: the tail resumes from its offset
    late = {"order_id": "A-1002", "customer": "Grace Hopper", "total": 18.0, "currency": "USD", "status": "shipped"}
    assert http.post(f"/ds/{BUCKET}/{ORDERS}", json=late).status_code == 204
    expect(log).to_contain_text('"status": "shipped"')
    expect(page.locator("#tail-state")).to_have_text("live")
    assert log.locator("pre.msg").count() == 5  # every message once: no gap, no repeat across reconnects
    tail = http.head(f"/ds/{BUCKET}/{ORDERS}").headers["stream-next-offset"]
    expect(meta).to_contain_text(tail)  # the control events keep the next offset current

    page.locator("#status").evaluate("node => { node.hidden = true; }")
    expect(page.locator("#tail-state")).to_have_text("live")
    save_screenshot(page, "console.png")
    page.click("#tail-stop")
    expect(page.locator("#tail-state")).to_have_text("stopped")
    assert console.errors == []


def test_a_binary_stream_tails_as_hex_and_takes_hex_appends(
    console: Console, server: RillProcess, http: httpx.Client
) -> None:
    page = console.page
    _open(page, server)
    _open_stream(page, BUCKET, "sensor/raw-frames")
    expect(page.locator("#append-encoding")).to_be_visible()
    _start_tail(page, "now")
    headers = {"content-type": "application/octet-stream"}
    assert http.post(f"/ds/{BUCKET}/sensor/raw-frames", headers=headers, content=b"\xde\xad\xbe\xef\x00\x01").is_success
    log = page.locator("#tail-log")
    expect(log.locator("pre.hex")).to_contain_text("de ad be ef 00 01")
    expect(log.locator("pre.b64")).to_contain_text("3q2+7wAB")

    page.select_option("#append-encoding", "hex")
    page.fill("#append-body", "ca fe ba be")
    page.click("#append-send")
    expect(log.locator("pre.hex").nth(1)).to_contain_text("ca fe ba be")
    body = http.get(f"/ds/{BUCKET}/sensor/raw-frames", params={"offset": "-1"}).content
    assert body == b"\xde\xad\xbe\xef\x00\x01\xca\xfe\xba\xbe"
    assert console.unexpected_errors("/snapshot") == []  # the stream has no snapshot: a 404, shown as none


def test_a_new_user_creates_a_bucket_and_a_stream_with_slashes_and_unicode(
    console: Console, server: RillProcess, http: httpx.Client
) -> None:
    page = console.page
    _open(page, server)
    page.locator("#bucket-create-box summary").click()
    page.fill("#new-bucket", "fresh-start")
    page.click("#bucket-create button[type=submit]")
    expect(page.locator("#status")).to_contain_text("Created bucket fresh-start")
    expect(page.locator("#streams-bucket")).to_have_text("fresh-start")

    name = "logs/été ✓/main"
    page.locator("#stream-create-box summary").click()
    page.fill("#new-stream", name)
    page.fill("#new-stream-type", "text/plain; charset=utf-8")
    page.click("#stream-create button[type=submit]")
    expect(page.locator("#stream-title")).to_have_text(name)
    expect(page.locator("#stream-list")).to_contain_text(name)
    url = f"/ds/fresh-start/{quote(name, safe='/')}"
    assert http.head(url).headers["content-type"].startswith("text/plain")

    _start_tail(page, "now")
    page.fill("#append-body", "hello, wörld")
    page.click("#append-send")
    expect(page.locator("#tail-log pre.text")).to_have_text("hello, wörld")
    assert http.get(url, params={"offset": "-1"}).text == "hello, wörld"
    assert console.unexpected_errors("/snapshot") == []


def test_api_errors_show_in_the_status_line(console: Console, server: RillProcess) -> None:
    page = console.page
    _open(page, server)
    page.locator("#bucket-create-box summary").click()
    page.fill("#new-bucket", "Bad Name")
    page.click("#bucket-create button[type=submit]")
    expect(page.locator("#status")).to_contain_text("400 invalid_bucket_id")
    page.fill("#bucket-prefix", "no-such-bucket")
    page.click("#bucket-search button[type=submit]")
    expect(page.locator("#bucket-list")).to_contain_text("No bucket starts with that.")
    assert [e for e in console.errors if "uncaught" in e] == []


def test_paging_through_streams(console: Console, server: RillProcess) -> None:
    page = console.page
    _open(page, server, "/console/?limit=2")
    page.locator("#bucket-list button.item", has_text=BUCKET).click()
    streams = page.locator("#stream-list button.item .name")
    expect(streams).to_have_text(["audit-log", "carts"])
    page.click("#stream-more")
    expect(streams).to_have_text(["audit-log", "carts", "orders", "payments/eu-west"])
    page.fill("#stream-prefix", "payments/")
    page.click("#stream-search button[type=submit]")
    expect(streams).to_have_text(["payments/eu-west", "payments/us-east"])
    expect(page.locator("#stream-more")).to_be_hidden()


def test_cluster_and_tiering_views(console: Console, server: RillProcess) -> None:
    page = console.page
    _open(page, server)
    page.click("#tab-cluster")
    expect(page.locator("#cluster-nodes tr")).to_have_count(1)
    expect(page.locator("#cluster-nodes")).to_contain_text("leader")
    page.click("#tab-tiering")
    expect(page.locator("#tiering-state")).to_contain_text("file://")
    expect(page.locator("#tiering-state")).to_contain_text("Segments uploaded")
    assert console.unexpected_errors("/_rill/cluster") == []  # a server without it answers 404: /healthz instead


def test_a_built_in_bucket_tails_through_its_own_route_family(
    console: Console, server: RillProcess, http: httpx.Client
) -> None:
    """compat.v1 is listed under /ds, but its streams live at /v1/stream/{path}."""
    assert http.put("/v1/stream/chat/room 1", headers={"content-type": "text/plain"}).status_code == 201
    page = console.page
    _open(page, server)
    page.locator("#bucket-list button.item", has_text="compat.v1").click()
    page.locator("#stream-list button.item", has_text="chat/room 1").click()
    expect(page.locator("#stream-attrs")).to_contain_text("on /ds streams only")
    _start_tail(page, "now")
    assert http.post("/v1/stream/chat/room 1", headers={"content-type": "text/plain"}, content="hi there").is_success
    expect(page.locator("#tail-log pre.text")).to_have_text("hi there")
    assert console.errors == []


def test_large_integers_are_shown_as_sent(console: Console, server: RillProcess, http: httpx.Client) -> None:
    """JSON.parse would round 12345678901234567891 to ...900: the tail shows the server's text."""
    assert http.put(f"/ds/{BUCKET}/ids", headers={"content-type": "application/json"}).status_code == 201
    page = console.page
    _open(page, server)
    _open_stream(page, BUCKET, "ids")
    _start_tail(page, "now")
    body = '{"id":12345678901234567891}'
    assert http.post(f"/ds/{BUCKET}/ids", headers={"content-type": "application/json"}, content=body).is_success
    expect(page.locator("#tail-log pre.json")).to_contain_text("12345678901234567891")
    assert console.unexpected_errors("/snapshot") == []
