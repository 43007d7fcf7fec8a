"""`rill buckets ...`, `rill streams list`, `rill create | close | delete` against a real server."""

from __future__ import annotations

import json

import httpx
import pytest
from rich.console import Console

from app.cli import buckets, listing
from tests.cli.conftest import invoke
from tests.server import RillProcess

Capture = pytest.CaptureFixture[bytes]


def test_buckets_create_list_delete(server: RillProcess, capsysbinary: Capture) -> None:
    s = server.url
    code, _, err = invoke(capsysbinary, "buckets", "create", "shop-orders", "--server", s)
    assert code == 0 and "created bucket shop-orders" in err
    code, _, err = invoke(capsysbinary, "buckets", "create", "shop-orders", "--server", s)
    assert code == 0 and "already exists" in err
    invoke(capsysbinary, "buckets", "create", "shop-users", "--server", s, "--retention", "max-age=3600")
    code, out, _ = invoke(capsysbinary, "buckets", "list", "--server", s)
    rows = [line.split("\t") for line in out.decode().splitlines()]  # a pipe: tab-separated
    assert [r[0] for r in rows] == ["compat.v1", "legacy.streams", "shop-orders", "shop-users"]
    assert rows[0][2] == "yes" and rows[2][2] == "no" and rows[2][1].endswith("Z")
    code, out, _ = invoke(capsysbinary, "buckets", "list", "--prefix", "shop-u", "--json", "--server", s)
    assert [json.loads(line)["name"] for line in out.decode().splitlines()] == ["shop-users"]
    code, _, err = invoke(capsysbinary, "buckets", "delete", "shop-users", "--server", s)
    assert code == 0 and "deleted bucket shop-users" in err
    code, _, err = invoke(capsysbinary, "buckets", "delete", "shop-users", "--server", s)
    assert code == 1 and err.startswith("rill: error: 404") and "Traceback" not in err


def test_bucket_with_streams_is_not_deleted(server: RillProcess, capsysbinary: Capture) -> None:
    s = server.url
    invoke(capsysbinary, "buckets", "create", "keepme", "--server", s)
    assert invoke(capsysbinary, "create", "keepme/a", "--server", s)[0] == 0
    code, _, err = invoke(capsysbinary, "buckets", "delete", "keepme", "--server", s)
    assert code == 1 and "409 bucket_not_empty" in err
    assert invoke(capsysbinary, "delete", "keepme/a", "--server", s)[0] == 0
    assert invoke(capsysbinary, "buckets", "delete", "keepme", "--server", s)[0] == 0


def test_bucket_listing_pages(server: RillProcess, capsysbinary: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("page-a", "page-b", "page-c", "page-d", "page-e"):
        invoke(capsysbinary, "buckets", "create", name, "--server", server.url)
    monkeypatch.setattr(listing, "PAGE", 2)
    _, out, _ = invoke(capsysbinary, "buckets", "list", "--prefix", "page-", "--server", server.url)
    assert [line.split("\t")[0] for line in out.decode().splitlines()] == [f"page-{c}" for c in "abcde"]


def test_create_and_list_streams(server: RillProcess, capsysbinary: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RILL_URL", server.url)  # the default --server
    invoke(capsysbinary, "buckets", "create", "listing")
    code, _, err = invoke(capsysbinary, "create", "listing/j", "--json")
    assert code == 0 and "created" in err and "application/json" in err
    assert invoke(capsysbinary, "create", "listing/t", "--content-type", "text/plain", "--ttl", "3600")[0] == 0
    assert invoke(capsysbinary, "create", "listing/dir/x y")[0] == 0  # slashes and a space in an id
    code, _, err = invoke(capsysbinary, "create", "listing/j", "--json")
    assert code == 0 and "already exists" in err
    code, _, err = invoke(capsysbinary, "create", "listing/j", "--content-type", "text/plain")
    assert code == 1 and "409" in err
    assert httpx.head(server.url + "/ds/listing/t").headers["stream-ttl"] == "3600"
    monkeypatch.setattr(listing, "PAGE", 1)
    code, out, _ = invoke(capsysbinary, "streams", "list", "listing", "--json")
    rows = [json.loads(line) for line in out.decode().splitlines()]
    assert [(r["name"], r["content_type"], r["closed"]) for r in rows] == [
        ("dir/x y", "application/octet-stream", False),
        ("j", "application/json", False),
        ("t", "text/plain", False),
    ]
    code, out, _ = invoke(capsysbinary, "close", "listing/t")
    assert code == 0 and out.decode().strip() == "0000000000000000_0000000000000000"
    code, out, _ = invoke(capsysbinary, "streams", "list", "listing", "--prefix", "t")
    assert out.decode().split("\t")[3] == "yes"  # closed


def test_builtin_buckets_list_their_families_streams(server: RillProcess, capsysbinary: Capture) -> None:
    assert invoke(capsysbinary, "create", "/v1/stream/compat-one", "--server", server.url)[0] == 0
    assert invoke(capsysbinary, "create", server.url + "/streams/legacy-one")[0] == 0
    assert invoke(capsysbinary, "create", "legacy.streams/legacy-two", "--server", server.url)[0] == 0
    assert httpx.head(server.url + "/streams/legacy-two").status_code == 200
    _, out, _ = invoke(capsysbinary, "streams", "list", "compat.v1", "--server", server.url)
    assert "compat-one" in out.decode()
    _, out, _ = invoke(capsysbinary, "streams", "list", "legacy.streams", "--server", server.url)
    assert "legacy-one" in out.decode() and "legacy-two" in out.decode()


def test_a_terminal_gets_a_table_that_fits() -> None:
    """A long name folds onto more lines; nothing is cut with an ellipsis."""
    rows = [{"name": "a-rather-long-bucket-name-" * 3, "created_at": "2025-01-01T00:00:00.000Z", "builtin": False}]
    console = Console(width=80, record=True)
    console.print(listing.table(rows, buckets.COLUMNS, "no buckets"))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "2025-01-01T00:00:00.000Z" in text and "…" not in text
    console.print(listing.table([], buckets.COLUMNS, "no buckets"))
    assert "no buckets" in console.export_text()


def test_names_are_shown_as_text_not_markup() -> None:
    """A stream may be named `a[/b]x` (rich would raise) or carry a terminal hyperlink."""
    names = ["a[/b]x", "[red]RED[/red] [link=http://evil.example]click[/link]"]
    rows = [{"name": name, "created_at": "2025-01-01T00:00:00.000Z", "builtin": False} for name in names]
    console = Console(width=200, record=True)
    console.print(listing.table(rows, buckets.COLUMNS, "no buckets"))
    text = console.export_text()
    assert all(name in text for name in names)


def test_subs_list_and_show(server: RillProcess, capsysbinary: Capture) -> None:
    base = server.url + "/v1/stream"
    httpx.put(base + "/subs-cli/wake", headers={"content-type": "application/json"}, content=b"[]")
    httpx.put(base + "/subs-cli/orders", headers={"content-type": "application/json"})
    body = {"type": "pull-wake", "streams": ["subs-cli/orders"], "wake_stream": "subs-cli/wake"}
    assert httpx.put(base + "/__ds/subscriptions/billing", json=body).status_code == 201
    httpx.post(base + "/subs-cli/orders", headers={"content-type": "application/json"}, content=b'[{"a": 1}, {"a": 2}]')
    code, out, _ = invoke(capsysbinary, "subs", "list", "/v1/stream/subs-cli/orders", "--server", server.url, "--json")
    (group,) = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and group["id"] == "billing" and group["lag_messages"] == 2
    code, out, _ = invoke(capsysbinary, "subs", "show", "/v1/stream", "billing", "--server", server.url)
    head, row = out.decode().splitlines()
    assert code == 0 and json.loads(head)["type"] == "pull-wake"
    assert row.split("\t")[:2] == ["subs-cli/orders", "explicit"]
    code, _, err = invoke(capsysbinary, "subs", "show", "/v1/stream", "missing", "--server", server.url)
    assert code == 1 and "404 SUBSCRIPTION_NOT_FOUND" in err
