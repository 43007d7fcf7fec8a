"""SSRF rules for webhook URLs: public addresses only, unless the operator allows a network."""

from __future__ import annotations

import ipaddress

import pytest

from app.subscriptions.urls import Resolver, WebhookUrlRejected, check_webhook_url, parse_networks


def resolver(*addresses: str) -> Resolver:
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


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "64:ff9b:1::5db8:d822",  # local-use NAT64: where the IPv4 address sits is the network's choice
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        "2002:a00:1::1",  # 6to4 of 10.0.0.1
        "2001:0:808:808:8000:ffff:80ff:fffe",  # Teredo, client 127.0.0.1
        "2001:0:808:808::a247:27dd",  # Teredo, client public: Teredo is not global either way
        "::7f00:1",  # IPv4-compatible 127.0.0.1
        "::ffff:0:7f00:1",  # IPv4-translated 127.0.0.1
        "192.0.0.8", "192.0.0.9", "192.0.0.10", "192.0.0.170",  # IETF protocol assignments
    ],
)  # fmt: skip
def test_addresses_that_lead_to_internal_ones_are_refused(address: str) -> None:
    with pytest.raises(WebhookUrlRejected, match="resolves to"):
        check_webhook_url("http://hooks.example/in", resolver=resolver(address))


@pytest.mark.parametrize("address", ["64:ff9b::5db8:d822", "2002:5db8:d822::1"])  # NAT64, 6to4 of 93.184.216.34
def test_nat64_and_6to4_of_a_public_address_are_allowed(address: str) -> None:
    assert check_webhook_url("http://hooks.example/in", resolver=resolver(address)) == [ipaddress.ip_address(address)]


@pytest.mark.parametrize(
    ("network", "address"),
    [("192.0.0.8/32", "192.0.0.8"), ("64:ff9b::/96", "64:ff9b::7f00:1"), ("2002:7f00:1::/48", "2002:7f00:1::")],
)
def test_an_allowed_network_admits_addresses_the_rules_refuse(network: str, address: str) -> None:
    assert check_webhook_url("http://hooks.example/in", parse_networks([network]), resolver=resolver(address))


def test_an_allowed_ipv4_network_does_not_admit_a_translation_of_its_addresses() -> None:
    with pytest.raises(WebhookUrlRejected):  # a NAT64 gateway's 127.0.0.1 is the gateway's, not ours
        check_webhook_url(
            "http://hooks.example/in", parse_networks(["127.0.0.1/32"]), resolver=resolver("64:ff9b::7f00:1")
        )


@pytest.mark.parametrize(
    "url", ["http://127.0.0\t.1:8080/hook", "http://hooks.example/a\nb", "http://hooks.example/ a"]
)
def test_whitespace_and_control_characters_are_refused(url: str) -> None:
    """urlsplit drops tabs and newlines where the HTTP client refuses them: a URL approved here could
    never be delivered to, and each try would cost a claim."""
    with pytest.raises(WebhookUrlRejected, match="control characters"):
        check_webhook_url(url, resolver=resolver("93.184.216.34"))


@pytest.mark.parametrize("address", ["fec0::1", "3fff::1"])
def test_site_local_and_documentation_ipv6_are_refused(address: str) -> None:
    with pytest.raises(WebhookUrlRejected):
        check_webhook_url("http://hooks.example/in", resolver=resolver(address))


def test_a_refusal_does_not_name_the_address_a_host_resolves_to() -> None:
    with pytest.raises(WebhookUrlRejected) as refused:
        check_webhook_url("http://intranet.example/in", resolver=resolver("10.20.30.40"))
    assert "10.20.30.40" not in str(refused.value)
