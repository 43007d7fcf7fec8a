"""Which webhook URLs a subscription may name (SSRF rules).

A webhook makes the server send requests on a client's behalf, so a URL must not reach the
server's own network: every address its host resolves to must be a public one, unless it falls
in a network the operator allows (`webhook_allowed_networks`, e.g. 127.0.0.1/32 for tests). An
IPv6 address that carries an IPv4 one (mapped, NAT64, 6to4, Teredo) is judged by the IPv4 address
it leads to. The check returns the addresses it approved, so a delivery connects to one of them
(app/subscriptions/pinned.py) and not to what the name resolves to by then (DNS rebinding).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]
MAX_URL_LENGTH = 2048

IETF_PROTOCOL = ipaddress.ip_network("192.0.0.0/24")  # some of it anycast, none of it a webhook's
NAT64 = ipaddress.ip_network("64:ff9b::/96")  # a translator carries the last 32 bits to IPv4
RESERVED = ipaddress.ip_network("::/8")  # IPv4-mapped, -compatible and -translated forms, and NAT64
DOCUMENTATION_V6 = ipaddress.ip_network("3fff::/20")  # RFC 9637; not yet known to Python 3.11's is_global


class WebhookUrlRejected(ValueError):
    """The URL is not one a webhook may call; the message says why."""


def resolve(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise WebhookUrlRejected(f"the host {host!r} does not resolve") from exc
    return sorted({str(info[4][0]) for info in infos})


def parse_networks(values: Sequence[str]) -> list[Network]:
    return [ipaddress.ip_network(v, strict=False) for v in values]


def _public(ip: IPAddress) -> bool:
    """Whatever reaches an IPv4 address through a translator or a tunnel is only as public as it."""
    if isinstance(ip, ipaddress.IPv4Address):
        return ip.is_global and not ip.is_multicast and ip not in IETF_PROTOCOL
    if ip.ipv4_mapped is not None:
        return _public(ip.ipv4_mapped)
    if ip in NAT64:
        return _public(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    if ip in RESERVED:
        return False  # e.g. local-use NAT64 (64:ff9b:1::/48), where the IPv4 address sits is the network's choice
    if ip.sixtofour is not None:
        return _public(ip.sixtofour)
    if ip.teredo is not None and not all(_public(v4) for v4 in ip.teredo):
        return False
    return ip.is_global and not ip.is_multicast and not ip.is_site_local and ip not in DOCUMENTATION_V6


def check_webhook_url(url: str, allowed: Sequence[Network] = (), resolver: Resolver = resolve) -> list[IPAddress]:
    """The addresses `url` may be called at; raises WebhookUrlRejected when it may not be called."""
    if len(url) > MAX_URL_LENGTH:
        raise WebhookUrlRejected(f"the URL is longer than {MAX_URL_LENGTH} characters")
    if any(c <= " " or c == "\x7f" for c in url):  # urlsplit drops tabs and newlines; the HTTP client would not
        raise WebhookUrlRejected("a webhook URL holds no spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise WebhookUrlRejected(f"not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise WebhookUrlRejected("a webhook URL is http:// or https://")
    if not parts.hostname:
        raise WebhookUrlRejected("a webhook URL names a host")
    if parts.username is not None or parts.password is not None:
        raise WebhookUrlRejected("a webhook URL carries no credentials")
    if parts.fragment:
        raise WebhookUrlRejected("a webhook URL has no #fragment")
    addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in resolver(parts.hostname, port)]
    if not addresses:
        raise WebhookUrlRejected(f"the host {parts.hostname!r} does not resolve")
    for ip in addresses:
        if not _public(ip) and not any(ip in network for network in allowed if ip.version == network.version):
            # Which address, it does not say: the server's resolver must not map internal names for clients.
            raise WebhookUrlRejected(
                f"{parts.hostname} resolves to a loopback, private, link-local or reserved address"
            )
    return addresses
