"""HTTP tests for the bucket routes of the /ds family: /ds/{bucket} and streams inside buckets."""

from __future__ import annotations

import re
import uuid

import httpx
import pytest

from tests.http.helpers import TEXT, assert_error

ISO_MS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
OFFSET = re.compile(r"^\d{16}_\d{16}$")


def new_bucket() -> str:
    return "b-" + uuid.uuid4().hex[:16]


@pytest.fixture()
def bucket(client: httpx.Client) -> str:
    name = new_bucket()
    assert client.put(f"/ds/{name}").status_code == 201
    return name


# ------------------------------------------------------------------------------------------------
# PUT /ds/{bucket}


def test_put_bucket_creates_then_is_idempotent(client: httpx.Client) -> None:
    name = new_bucket()
    first = client.put(f"/ds/{name}")
    assert first.status_code == 201, first.text
    second = client.put(f"/ds/{name}")
    assert second.status_code == 200, second.text
    assert client.get(f"/ds/{name}").status_code == 200


@pytest.mark.parametrize(
    "bucket_id",
    [
        "abcd",  # shortest allowed
        "a" * 64,  # longest allowed
        "a_b-c0",
        "0123",
    ],
)
def test_put_bucket_accepts_valid_ids(client: httpx.Client, bucket_id: str) -> None:
    # These ids are fixed rather than random, so tolerate "already exists" (200) too.
    resp = client.put(f"/ds/{bucket_id}")
    assert resp.status_code in (200, 201), resp.text
    assert client.get(f"/ds/{bucket_id}").status_code == 200


INVALID_BUCKETS = [
    pytest.param("abc", id="too-short"),
    pytest.param("a" * 65, id="too-long"),
    pytest.param("ABCD", id="uppercase"),
    pytest.param("abCd", id="mixed-case"),
    pytest.param("ab.cd", id="dot"),
    pytest.param("ab%20cd", id="space"),
    pytest.param("abc%00d", id="nul"),
]
# The built-in buckets are listed on /ds (read-only), but their streams live in their own families.
NOT_DS_BUCKETS = [
    *INVALID_BUCKETS,
    pytest.param("compat.v1", id="builtin-compat"),
    pytest.param("legacy.streams", id="builtin-legacy"),
]


@pytest.mark.parametrize("bucket_id", INVALID_BUCKETS)
@pytest.mark.parametrize("method", ["PUT", "GET", "DELETE", "POST"])
def test_invalid_bucket_ids_are_400(client: httpx.Client, method: str, bucket_id: str) -> None:
    assert_error(client.request(method, f"/ds/{bucket_id}"), 400)


@pytest.mark.parametrize("bucket_id", INVALID_BUCKETS)
def test_invalid_bucket_head_is_400(client: httpx.Client, bucket_id: str) -> None:
    resp = client.head(f"/ds/{bucket_id}")
    assert resp.status_code == 400
    assert resp.content == b""


@pytest.mark.parametrize("bucket_id", NOT_DS_BUCKETS)
@pytest.mark.parametrize("method", ["PUT", "POST", "GET", "DELETE"])
def test_stream_in_invalid_bucket_is_400(client: httpx.Client, method: str, bucket_id: str) -> None:
    resp = client.request(method, f"/ds/{bucket_id}/s-1", headers=TEXT, content=b"x" if method == "POST" else b"")
    assert_error(resp, 400)


def test_invalid_bucket_is_not_created(client: httpx.Client) -> None:
    assert_error(client.put("/ds/UPPERCASE"), 400)
    assert_error(client.get("/ds/UPPERCASE"), 400)
    assert_error(client.get("/ds/uppercase"), 404)


# ------------------------------------------------------------------------------------------------
# GET /ds/{bucket}: metadata and paged listing


def _names(resp: httpx.Response) -> list[str]:
    return [s["name"] for s in resp.json()["streams"]]


def test_get_bucket_metadata_empty(client: httpx.Client, bucket: str) -> None:
    resp = client.get(f"/ds/{bucket}")
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "application/json"
    assert "no-store" in resp.headers.get("cache-control", "")
    body = resp.json()
    assert body["bucket"] == bucket
    assert ISO_MS.match(body["created_at"]), body
    assert body["streams"] == []
    assert body["has_more"] is False
    assert body["next"] is None


def test_head_bucket(client: httpx.Client, bucket: str) -> None:
    resp = client.head(f"/ds/{bucket}")
    assert resp.status_code == 200
    assert resp.content == b""
    assert client.head(f"/ds/{new_bucket()}").status_code == 404


def test_get_missing_bucket_is_404(client: httpx.Client) -> None:
    assert_error(client.get(f"/ds/{new_bucket()}"), 404)


@pytest.fixture()
def listed_bucket(client: httpx.Client, bucket: str) -> str:
    for name in ["a/1", "a/2", "a/3", "b/1"]:
        assert client.put(f"/ds/{bucket}/{name}", headers=TEXT, content=name.encode()).status_code == 201
    resp = client.put(f"/ds/{bucket}/c", headers={"content-type": "application/json", "stream-closed": "true"})
    assert resp.status_code == 201
    # A deleted stream never shows up.
    assert client.put(f"/ds/{bucket}/a/0", headers=TEXT).status_code == 201
    assert client.delete(f"/ds/{bucket}/a/0").status_code == 204
    return bucket


def test_listing_entries(client: httpx.Client, listed_bucket: str) -> None:
    resp = client.get(f"/ds/{listed_bucket}")
    assert resp.status_code == 200
    body = resp.json()
    assert _names(resp) == ["a/1", "a/2", "a/3", "b/1", "c"]
    assert body["has_more"] is False and body["next"] is None
    by_name = {s["name"]: s for s in body["streams"]}
    a1 = by_name["a/1"]
    assert a1["content_type"] == "text/plain"
    assert a1["closed"] is False
    assert OFFSET.match(a1["next_offset"])
    # next_offset is the tail: reading from it is empty and up to date.
    tail = client.get(f"/ds/{listed_bucket}/a/1").headers["stream-next-offset"]
    assert a1["next_offset"] == tail
    assert ISO_MS.match(a1["created_at"])
    c = by_name["c"]
    assert c["content_type"] == "application/json"
    assert c["closed"] is True


def test_listing_pages_with_limit_and_after(client: httpx.Client, listed_bucket: str) -> None:
    url = f"/ds/{listed_bucket}"
    page1 = client.get(url, params={"limit": 2})
    assert page1.status_code == 200
    assert _names(page1) == ["a/1", "a/2"]
    assert page1.json()["has_more"] is True
    assert page1.json()["next"] == "a/2"

    page2 = client.get(url, params={"limit": 2, "after": page1.json()["next"]})
    assert _names(page2) == ["a/3", "b/1"]
    assert page2.json()["has_more"] is True
    assert page2.json()["next"] == "b/1"

    page3 = client.get(url, params={"limit": 2, "after": page2.json()["next"]})
    assert _names(page3) == ["c"]
    assert page3.json()["has_more"] is False
    assert page3.json()["next"] is None

    # Exactly `limit` streams left: no more pages.
    exact = client.get(url, params={"limit": 5})
    assert len(_names(exact)) == 5
    assert exact.json()["has_more"] is False and exact.json()["next"] is None


def test_listing_limit_bounds(client: httpx.Client, listed_bucket: str) -> None:
    url = f"/ds/{listed_bucket}"
    one = client.get(url, params={"limit": 1})
    assert _names(one) == ["a/1"]
    assert one.json()["has_more"] is True and one.json()["next"] == "a/1"
    thousand = client.get(url, params={"limit": 1000})
    assert thousand.status_code == 200
    assert len(_names(thousand)) == 5


def test_listing_prefix(client: httpx.Client, listed_bucket: str) -> None:
    url = f"/ds/{listed_bucket}"
    assert _names(client.get(url, params={"prefix": "a/"})) == ["a/1", "a/2", "a/3"]
    assert _names(client.get(url, params={"prefix": "b"})) == ["b/1"]
    assert _names(client.get(url, params={"prefix": "zzz"})) == []
    paged = client.get(url, params={"prefix": "a/", "limit": 2})
    assert _names(paged) == ["a/1", "a/2"]
    assert paged.json()["has_more"] is True and paged.json()["next"] == "a/2"
    rest = client.get(url, params={"prefix": "a/", "limit": 2, "after": "a/2"})
    assert _names(rest) == ["a/3"]
    assert rest.json()["has_more"] is False and rest.json()["next"] is None
    # `after` before the prefix range starts at the prefix; after past it is empty.
    assert _names(client.get(url, params={"prefix": "b", "after": "a"})) == ["b/1"]
    assert _names(client.get(url, params={"prefix": "a/", "after": "b"})) == []


@pytest.mark.parametrize("limit", ["0", "1001", "x", "-1", "1.5", "99999999999999999999"])
def test_listing_bad_limit_is_400(client: httpx.Client, bucket: str, limit: str) -> None:
    assert_error(client.get(f"/ds/{bucket}", params={"limit": limit}), 400)


def test_listing_repeated_limit_is_400(client: httpx.Client, bucket: str) -> None:
    assert_error(client.get(f"/ds/{bucket}?limit=1&limit=2"), 400)


# ------------------------------------------------------------------------------------------------
# DELETE /ds/{bucket}


def test_delete_empty_bucket(client: httpx.Client, bucket: str) -> None:
    resp = client.delete(f"/ds/{bucket}")
    assert resp.status_code == 204
    assert resp.content == b""
    assert_error(client.get(f"/ds/{bucket}"), 404)
    assert_error(client.delete(f"/ds/{bucket}"), 404)
    # It can be created again.
    assert client.put(f"/ds/{bucket}").status_code == 201


def test_delete_non_empty_bucket_is_409(client: httpx.Client, bucket: str) -> None:
    assert client.put(f"/ds/{bucket}/keep", headers=TEXT, content=b"data").status_code == 201
    assert_error(client.delete(f"/ds/{bucket}"), 409)
    # Nothing was removed.
    assert client.get(f"/ds/{bucket}").status_code == 200
    read = client.get(f"/ds/{bucket}/keep")
    assert read.status_code == 200 and read.content == b"data"
    # Once the stream is gone, the bucket can be deleted.
    assert client.delete(f"/ds/{bucket}/keep").status_code == 204
    assert client.delete(f"/ds/{bucket}").status_code == 204


def test_delete_missing_bucket_is_404(client: httpx.Client) -> None:
    assert_error(client.delete(f"/ds/{new_bucket()}"), 404)


# ------------------------------------------------------------------------------------------------
# Streams in a missing bucket, and methods on buckets


@pytest.mark.parametrize(
    ("method", "path", "headers", "content"),
    [
        ("PUT", "s", TEXT, b""),
        ("PUT", "s", TEXT, b"body"),
        ("POST", "s", TEXT, b"data"),
        ("POST", "s", {"stream-closed": "true"}, b""),
        ("GET", "s", {}, b""),
        ("GET", "s?offset=now", {}, b""),
        ("GET", "s?offset=-1&live=long-poll", {}, b""),
        ("GET", "s?offset=-1&live=sse", {}, b""),
        ("DELETE", "s", {}, b""),
        ("PUT", "a/b/c", TEXT, b""),
    ],
)
def test_stream_ops_in_missing_bucket_are_404(
    client: httpx.Client, method: str, path: str, headers: dict[str, str], content: bytes
) -> None:
    bucket = new_bucket()
    assert_error(client.request(method, f"/ds/{bucket}/{path}", headers=headers, content=content), 404)
    # Nothing got created along the way.
    assert_error(client.get(f"/ds/{bucket}"), 404)


def test_head_stream_in_missing_bucket_is_404(client: httpx.Client) -> None:
    resp = client.head(f"/ds/{new_bucket()}/s")
    assert resp.status_code == 404
    assert resp.content == b""


def test_stream_missing_in_existing_bucket_is_404(client: httpx.Client, bucket: str) -> None:
    assert_error(client.get(f"/ds/{bucket}/nope"), 404)
    assert_error(client.post(f"/ds/{bucket}/nope", headers=TEXT, content=b"x"), 404)
    assert_error(client.delete(f"/ds/{bucket}/nope"), 404)


def test_post_on_bucket_is_405(client: httpx.Client, bucket: str) -> None:
    resp = client.post(f"/ds/{bucket}", headers=TEXT, content=b"x")
    assert_error(resp, 405)
    allow = {m.strip() for m in resp.headers.get("allow", "").split(",")}
    assert "POST" not in allow and {"GET", "PUT", "DELETE"} <= allow
    # Also on a bucket that does not exist (the method is wrong whatever the bucket).
    assert_error(client.post(f"/ds/{new_bucket()}", headers=TEXT, content=b"x"), 405)
    # The bucket is untouched.
    assert client.get(f"/ds/{bucket}").json()["streams"] == []


def test_unknown_method_on_bucket_is_405(client: httpx.Client, bucket: str) -> None:
    assert_error(client.request("PATCH", f"/ds/{bucket}"), 405)


def test_unknown_route_is_404_json(client: httpx.Client) -> None:
    assert_error(client.get("/dsx"), 404)
    assert_error(client.get("/no/such/route"), 404)


def test_buckets_isolate_streams(client: httpx.Client, bucket: str) -> None:
    other = new_bucket()
    assert client.put(f"/ds/{other}").status_code == 201
    assert client.put(f"/ds/{bucket}/same", headers=TEXT, content=b"one").status_code == 201
    assert client.put(f"/ds/{other}/same", headers=TEXT, content=b"two").status_code == 201
    assert client.get(f"/ds/{bucket}/same").content == b"one"
    assert client.get(f"/ds/{other}/same").content == b"two"
    assert _names(client.get(f"/ds/{other}")) == ["same"]


# ------------------------------------------------------------------------------------------------
# GET /ds: the bucket listing, and the built-in buckets' stream listings


def test_the_bucket_listing_pages_by_name(client: httpx.Client) -> None:
    prefix = "lst-" + uuid.uuid4().hex[:8]
    names = [f"{prefix}-{i}" for i in range(5)]
    for name in reversed(names):
        assert client.put(f"/ds/{name}").status_code == 201
    first = client.get("/ds", params={"prefix": prefix, "limit": 2})
    assert first.status_code == 200 and first.headers["cache-control"] == "no-store"
    body = first.json()
    assert [b["name"] for b in body["buckets"]] == names[:2]
    assert body["has_more"] is True and body["next"] == names[1]
    assert all(ISO_MS.match(b["created_at"]) and b["builtin"] is False for b in body["buckets"])
    rest = client.get("/ds/", params={"prefix": prefix, "after": body["next"], "limit": 1000}).json()
    assert [b["name"] for b in rest["buckets"]] == names[2:]
    assert rest["has_more"] is False and rest["next"] is None
    client.delete(f"/ds/{names[0]}")
    assert [b["name"] for b in client.get("/ds", params={"prefix": prefix}).json()["buckets"]] == names[1:]


def test_the_bucket_listing_shows_the_builtin_buckets(client: httpx.Client) -> None:
    listed = {b["name"]: b for b in client.get("/ds", params={"limit": 1000}).json()["buckets"]}
    assert listed["compat.v1"] == {"name": "compat.v1", "created_at": None, "builtin": True}
    assert listed["legacy.streams"]["builtin"] is True


@pytest.mark.parametrize("query", [{"limit": "0"}, {"limit": "1001"}, {"limit": "x"}, {"limit": ["1", "2"]}])
def test_the_bucket_listing_refuses_a_bad_limit(client: httpx.Client, query: dict[str, object]) -> None:
    assert assert_error(client.get("/ds", params=query), 400)["code"] == "invalid_limit"


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_the_bucket_listing_is_read_only(client: httpx.Client, method: str) -> None:
    resp = client.request(method, "/ds")
    assert assert_error(resp, 405)["code"] == "method_not_allowed"
    assert resp.headers["allow"] == "GET, HEAD, OPTIONS"


@pytest.mark.parametrize(("bucket", "family"), [("compat.v1", "/v1/stream/"), ("legacy.streams", "/streams/")])
def test_a_builtin_bucket_lists_its_familys_streams(client: httpx.Client, bucket: str, family: str) -> None:
    name = "lst/" + uuid.uuid4().hex[:8]
    assert client.put(family + name, headers={"content-type": "text/plain"}).status_code == 201
    listing = client.get(f"/ds/{bucket}", params={"prefix": "lst/", "limit": 1000})
    assert listing.status_code == 200, listing.text
    assert listing.json()["created_at"] is None
    assert name in [s["name"] for s in listing.json()["streams"]]
    for method in ("PUT", "DELETE"):
        assert assert_error(client.request(method, f"/ds/{bucket}"), 405)["code"] == "method_not_allowed"
    assert client.get(f"/ds/{bucket}/{name}").status_code == 400  # its streams live in their own family
