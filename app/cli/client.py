"""HTTP for the data commands: where a URL argument points, the bearer token, the CA, redirects
followed by hand, and server errors turned into one-line messages.

Redirects (a follower's 307 to the leader) are followed here rather than by httpx, which drops
`Authorization` when the leader is another origin (another port). The token goes on to another
port of the same host, never to another host nor from https:// to http://: such a redirect is an
error that names where it pointed.
"""

from __future__ import annotations

import argparse
import os
import ssl
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote, urljoin

import httpx

DEFAULT_SERVER = "http://127.0.0.1:4437"
MAX_REDIRECTS = 10
# The route families' built-in buckets: BUCKET/STREAM with one of them means the family's URL.
FAMILIES = {"compat.v1": "/v1/stream/", "legacy.streams": "/streams/"}
MAX_UNAVAILABLE = 10  # 503s with Retry-After (no leader yet, a full backlog) retried before giving up


class CliError(Exception):
    """A failure the user can act on: printed as `rill: error: <message>`, exit status `status`."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


class UsageError(CliError):
    def __init__(self, message: str) -> None:
        super().__init__(message, 2)


class Unreachable(CliError):
    """The request did not get an answer: connection refused, reset, timed out."""


class HttpError(CliError):
    """The server answered with an error status; `code` is its JSON error code, if it sent one."""

    def __init__(self, message: str, response: httpx.Response, code: str | None) -> None:
        super().__init__(message)
        self.response = response
        self.code = code


def add_connection_args(parser: argparse.ArgumentParser) -> None:
    server = os.environ.get("RILL_URL") or DEFAULT_SERVER
    parser.add_argument(
        "--server", default=server, metavar="URL", help=f"base URL for BUCKET/STREAM and listings (default: {server})"
    )
    parser.add_argument("--token", metavar="TOKEN", help="bearer token (default: $RILL_TOKEN)")
    parser.add_argument(
        "--tls-ca", type=Path, metavar="PEM", help="CA bundle for https:// servers (default: system CAs)"
    )


def server_url(server: str) -> str:
    if not server.startswith(("http://", "https://")):
        raise UsageError(f"--server {server!r} is not an http:// or https:// URL")
    return server.rstrip("/")


def resolve_url(target: str, server: str) -> str:
    """A stream argument as a URL: a full URL as given, a path (`/v1/stream/x`) on `server`, or
    `BUCKET/STREAM` as `{server}/ds/BUCKET/STREAM` (percent-encoded; `compat.v1/x` is `/v1/stream/x`
    and `legacy.streams/x` is `/streams/x`)."""
    if target.startswith(("http://", "https://")):
        return target
    if "://" in target:
        raise UsageError(f"{target!r}: only http:// and https:// URLs are supported")
    if target.startswith("/"):
        return server_url(server) + target
    bucket, slash, stream = target.partition("/")
    if not slash or not bucket or not stream:
        raise UsageError(f"{target!r} is neither a URL nor BUCKET/STREAM")
    base = FAMILIES.get(bucket) or f"/ds/{quote(bucket, safe='')}/"
    return server_url(server) + base + quote(stream, safe="/")


def verify_option(ca: Path | None) -> ssl.SSLContext | bool:
    if ca is None:
        return True
    try:
        return ssl.create_default_context(cafile=str(ca))
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"--tls-ca {ca}: {getattr(exc, 'strerror', None) or 'holds no PEM certificate'}") from None


def checked_token(token: str) -> str:
    """The token as a header carries it (without the line break a file ends in); a UsageError, which
    never shows it, if it holds a character no header can carry."""
    token = token.strip()
    if not _header_safe(token) or " " in token:
        raise UsageError("the token holds a space, a line break or a non-ASCII character: no header can carry it")
    return token


def _header_safe(value: str) -> bool:
    return value.isascii() and all(" " <= c != "\x7f" for c in value)


class Client:
    """One keep-alive HTTP client for a command, carrying the token on every request."""

    def __init__(self, args: argparse.Namespace, timeout: httpx.Timeout | float = 30.0) -> None:
        self.server = server_url(args.server)
        self.token = checked_token(args.token or os.environ.get("RILL_TOKEN", ""))
        self.http = httpx.Client(verify=verify_option(args.tls_ca), timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def url(self, target: str) -> str:
        return resolve_url(target, self.server)

    def request(
        self,
        method: str,
        url: str,
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        content: bytes | None = None,
    ) -> httpx.Response:
        """A request whose whole body is read; an error status raises HttpError."""
        with self.open(method, url, params=params, headers=headers, content=content) as response:
            response.read()
            return response

    def head(self, url: str) -> httpx.Response:
        """A stream's metadata. HEAD errors have no body, so a failure is asked again as a GET of
        nothing (`offset=now`) to report the server's message."""
        try:
            return self.request("HEAD", url)
        except HttpError as exc:
            if exc.code is not None:
                raise
            try:
                self.request("GET", url, params={"offset": "now"})
            except HttpError as detailed:
                raise detailed from None
            raise

    @contextmanager
    def open(
        self,
        method: str,
        url: str,
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        content: bytes | None = None,
    ) -> Iterator[httpx.Response]:
        """A streamed response, after redirects and 503 retries; an error status raises HttpError."""
        for name, value in (headers or {}).items():
            if not _header_safe(value):
                raise UsageError(f"{name}: {value[:100]!r} holds a line break or a non-ASCII character")
        try:
            target = str(httpx.URL(url, params=params)) if params else url
            first = httpx.URL(target)
        except httpx.InvalidURL as exc:
            raise UsageError(f"{url[:200]!r} is not a valid URL: {exc}") from None
        unavailable = 0
        for _ in range(MAX_REDIRECTS + MAX_UNAVAILABLE):
            sent = dict(headers or {})
            if self.token:
                sent["authorization"] = f"Bearer {self.token}"
            request = self.http.build_request(method, target, headers=sent, content=content)
            response = self._send(request)
            status = response.status_code
            if status in (307, 308) and "location" in response.headers:
                response.close()
                target = urljoin(str(request.url), response.headers["location"])  # the query comes along
                if self.token and not _same_host(first, httpx.URL(target)):
                    where = _origin(httpx.URL(target))
                    raise CliError(f"redirected to {where}, another host: the token is not sent there (use that URL)")
                continue
            if 300 <= status < 400:
                response.close()
                raise CliError(
                    f"{method} {url}: the server answered {status} (a redirect this command does not follow)"
                )
            if status == 503 and "retry-after" in response.headers and unavailable < MAX_UNAVAILABLE:
                if not _safe_to_repeat(method, sent, response):  # which has read its body
                    error = self.error(response)
                    raise HttpError(f"{error} (it may have been applied: not sent again)", response, error.code)
                response.close()
                unavailable += 1
                time.sleep(_seconds(response.headers["retry-after"]))
                continue
            try:
                if status >= 400:
                    response.read()
                    raise self.error(response)
                yield response
            finally:
                response.close()
            return
        raise CliError(f"{method} {url}: too many redirects or retries")

    def _send(self, request: httpx.Request) -> httpx.Response:
        try:
            return self.http.send(request, stream=True)
        except httpx.ConnectError as exc:
            raise Unreachable(f"cannot connect to {_origin(request.url)}: {_reason(exc)}") from None
        except httpx.TimeoutException:
            raise Unreachable(f"{request.method} {request.url}: timed out") from None
        except httpx.LocalProtocolError:  # its message would show the header values, the token's too
            raise CliError(f"{request.method} {request.url}: the request could not be sent as HTTP") from None
        except httpx.HTTPError as exc:
            raise Unreachable(f"{request.method} {request.url}: {_reason(exc)}") from None

    def error(self, response: httpx.Response) -> HttpError:
        """The server's JSON error (`{"error": {"code", "message"}}`) as one line."""
        code, message = _error_fields(response)
        text = f"{response.status_code} {code}: {message}" if code else f"{response.status_code}: {message}"
        if response.status_code == 401 and not self.token:
            text += " (pass --token or set RILL_TOKEN)"
        return HttpError(text, response, code)


# 503s after which a write may have been applied: the leader changed with it in flight, or a
# follower's forward got no answer.
OUTCOME_UNKNOWN = frozenset({"retry", "leader_unreachable"})


def _safe_to_repeat(method: str, headers: Mapping[str, str], response: httpx.Response) -> bool:
    """Whether a request answered 503 may be sent again: anything but an append without a producer
    (whose repeat the server would store twice) after an answer that leaves its outcome unknown."""
    if method != "POST" or "producer-id" in {name.lower() for name in headers}:
        return True
    response.read()
    return _error_fields(response)[0] not in OUTCOME_UNKNOWN


def _error_fields(response: httpx.Response) -> tuple[str | None, str]:
    try:
        error = response.json()["error"]
        return str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        text = " ".join(response.text.split())[:200]
        return None, text or response.reason_phrase or "error"


def _seconds(value: str) -> float:
    try:
        return min(max(float(value), 0.1), 5.0)
    except ValueError:
        return 1.0


def _same_host(first: httpx.URL, then: httpx.URL) -> bool:
    """Whether a redirect may carry the token: the same host (any port), and no step down to http."""
    return then.host == first.host and not (first.scheme == "https" and then.scheme != "https")


def _origin(url: httpx.URL) -> str:
    return f"{url.scheme}://{url.netloc.decode('ascii', 'replace')}"


def _reason(exc: Exception) -> str:
    text = str(exc)
    if "Connection refused" in text or "Errno 111" in text:
        return "connection refused"
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return "its certificate is not trusted (--tls-ca names the CA that signed it)"
    return " ".join(text.split()) or type(exc).__name__
