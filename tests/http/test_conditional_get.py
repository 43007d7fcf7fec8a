"""Conditional GET: ETag and If-None-Match.

Run against every route family (/ds/<bucket>/, /streams/, /v1/stream/) through the `path` and `base` fixtures.
Every error response must be `application/json` with {"error": {"code": str, "message": str}}
(`assert_error`); after a rejected write the stream's data must be unchanged (`assert_unchanged`).
"""

from __future__ import annotations

import httpx

from tests.http.helpers import TEXT, create


def test_etag_and_if_none_match(client: httpx.Client, path: str) -> None:
    create(client, path, b"v1")
    first = client.get(path, params={"offset": "-1"})
    tag = first.headers["etag"]
    assert tag
    not_modified = client.get(path, params={"offset": "-1"}, headers={"if-none-match": tag})
    assert not_modified.status_code == 304
    assert not_modified.content == b""
    wrong = client.get(path, params={"offset": "-1"}, headers={"if-none-match": '"wrong-etag"'})
    assert wrong.status_code == 200 and wrong.content == b"v1"
    assert client.post(path, headers=TEXT, content=b"v2").status_code == 204
    after = client.get(path, params={"offset": "-1"}, headers={"if-none-match": tag})
    assert after.status_code == 200
    assert after.content == b"v1v2"
    assert after.headers["etag"] != tag


def test_if_none_match_compares_weakly_and_takes_lists_and_a_star(client: httpx.Client, path: str) -> None:
    create(client, path, b"v1")
    tag = client.get(path, params={"offset": "-1"}).headers["etag"]
    for header in (f'"other", {tag}', f"W/{tag}", "*", f'{tag} ,"x"'):
        again = client.get(path, params={"offset": "-1"}, headers={"if-none-match": header})
        assert again.status_code == 304, header
    for header in ('"other"', tag.strip('"'), f'"x{tag[1:]}'):
        assert client.get(path, params={"offset": "-1"}, headers={"if-none-match": header}).status_code == 200
