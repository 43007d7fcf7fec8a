"""Posting a webhook to an address check_webhook_url approved, not to what the name resolves to by then.

httpx resolves a URL's host when it connects, so a name that answered a public address at the
check may answer 127.0.0.1 a moment later (DNS rebinding). Here the URL's host becomes the approved
IP literal, and the name stays where the receiver needs it: the Host header and, for https, the
TLS server name, which is also the name the certificate is checked against (httpcore hands the
"sni_hostname" extension to the ssl module as `server_hostname`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

import httpx

from app.subscriptions.urls import IPAddress

MAX_ANSWER_BYTES = 64 * 1024  # of a webhook's answer: enough for {"done": true} and then some


async def post_pinned(
    client: httpx.AsyncClient, url: str, addresses: Sequence[IPAddress], body: bytes, headers: Mapping[str, str]
) -> httpx.Response:
    """POST `body` to `url` at the first of `addresses` that takes the connection; redirects are not followed.

    Only a failure to connect (nothing sent) moves on to the next address. `client` is an HTTP/1.1
    one without a proxy: a proxy's TLS would be checked against the IP literal, and so fail.
    """
    if not addresses:
        raise ValueError("no approved address to post to")
    target = httpx.URL(url)
    sent = httpx.Headers(headers)
    sent["host"] = target.netloc.decode("ascii")
    extensions: dict[str, str] = {}
    if target.scheme == "https":
        extensions["sni_hostname"] = target.raw_host.decode("ascii")
        # The pool knows a connection by IP and port only: another name at this address must not
        # reuse one whose certificate was checked for this name.
        sent["connection"] = "close"

    async def post(ip: IPAddress) -> httpx.Response:
        pinned = target.copy_with(host=str(ip))
        request = client.build_request("POST", pinned, content=body, headers=sent, extensions=extensions)
        response = await client.send(request, stream=True, follow_redirects=False)
        try:  # the receiver's answer is read up to MAX_ANSWER_BYTES: any endpoint may answer without end
            kept = bytearray()
            async for piece in response.aiter_bytes():
                kept += piece
                if len(kept) >= MAX_ANSWER_BYTES:
                    break
        finally:
            await response.aclose()
        return httpx.Response(response.status_code, content=bytes(kept[:MAX_ANSWER_BYTES]), request=request)

    for ip in addresses[:-1]:
        with contextlib.suppress(httpx.ConnectError, httpx.ConnectTimeout):
            return await post(ip)
    return await post(addresses[-1])
