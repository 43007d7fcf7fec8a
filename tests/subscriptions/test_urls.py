"""SSRF rules for webhook URLs: public addresses only, unless the operator allows a network."""

from __future__ import annotations

import ipaddress

import pytest

from app.subscriptions.urls import WebhookUrlRejected, check_webhook_url, parse_networks


def resolver(*addresses: str):  # type: ignore[no-untyped-def]
    return lambda host, port: list(addresses)


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1", "10.0.0.1", "172.16.5.4", "192.168.1.1", "169.254.169.254", "0.0.0.0", "100.64.0.1",
        "224.0.0.1", "::1", "fe80::1", "fc00::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1",
    ],
)  # fmt: skip
def test_internal_addresses_are_refused(address: str) -> None:
    with pytest.raises(WebhookUrlRejected, match="resolves to"):
        check_webhook_url("http://hooks.example/in", resolver=resolver(address))


def test_a_public_address_is_allowed_and_returned() -> None:
    assert check_webhook_url("https://hooks.example/in", resolver=resolver("93.184.216.34")) == [
        ipaddress.ip_address("93.184.216.34")
    ]


def test_one_internal_address_among_public_ones_is_enough_to_refuse() -> None:
    with pytest.raises(WebhookUrlRejected):
        check_webhook_url("http://hooks.example/", resolver=resolver("93.184.216.34", "10.1.2.3"))


def test_an_allowed_network_admits_its_addresses_only() -> None:
    allowed = parse_networks(["127.0.0.1/32"])
    assert check_webhook_url("http://127.0.0.1:9999/hook", allowed, resolver=resolver("127.0.0.1"))
    with pytest.raises(WebhookUrlRejected):
        check_webhook_url("http://127.0.0.2/hook", allowed, resolver=resolver("127.0.0.2"))
    with pytest.raises(WebhookUrlRejected):
        check_webhook_url("http://[::1]/hook", allowed, resolver=resolver("::1"))


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://hooks.example/", "http:// or https://"),
        ("http:///path", "names a host"),
        ("http://user:pw@hooks.example/", "no credentials"),
        ("http://hooks.example/#x", "no #fragment"),
        ("http://hooks.example:99999/", "not a URL"),
        ("http://hooks.example/" + "a" * 2100, "longer than"),
    ],
)
def test_malformed_urls_are_refused(url: str, reason: str) -> None:
    with pytest.raises(WebhookUrlRejected, match=reason):
        check_webhook_url(url, resolver=resolver("93.184.216.34"))


def test_a_name_that_does_not_resolve_is_refused() -> None:
    with pytest.raises(WebhookUrlRejected, match="does not resolve"):
        check_webhook_url("http://no-such-host.invalid/hook")
