"""`ratelimit.identity`: who a request counts against, from raw ASGI headers and the peer,
without a web framework; and the text a route asks its limiter about."""

from __future__ import annotations

import ipaddress

import pytest

from ratelimit import identity, keys
from ratelimit.identity import BadIdentity, ClientIdentity, RequestIdentity


def headers(*pairs: tuple[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in pairs]


def test_an_api_key_names_the_client():
    who = RequestIdentity().of(headers(("host", "x"), ("x-api-key", " k-1 ")), "192.0.2.1")
    assert who == ClientIdentity("key", "k-1")  # surrounding blanks are not part of it
    assert str(who) == "key:k-1"


def test_the_header_name_is_matched_whatever_its_case():
    ours = RequestIdentity(api_key_header="X-Client-Key")
    assert ours.of(headers(("X-CLIENT-KEY", "k")), "192.0.2.1") == ClientIdentity("key", "k")
    # Another header of the same length is not it.
    assert ours.of(headers(("x-client-kez", "k")), "192.0.2.1").kind == "address"


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_api_key_falls_back_to_the_address(value):
    who = RequestIdentity().of(headers(("x-api-key", value)), "192.0.2.1")
    assert who == ClientIdentity("address", "192.0.2.1")


def test_without_an_api_key_header_only_addresses_count():
    who = RequestIdentity(api_key_header=None).of(headers(("x-api-key", "k")), "192.0.2.1")
    assert who == ClientIdentity("address", "192.0.2.1")


def test_two_api_keys_are_a_bad_request():
    with pytest.raises(BadIdentity) as caught:
        RequestIdentity().of(headers(("x-api-key", "a"), ("X-Api-Key", "b")), "192.0.2.1")
    assert caught.value.status == 400 and "at most one" in caught.value.detail


def test_an_api_key_longer_than_allowed_is_431():
    ours = RequestIdentity(max_api_key_bytes=8)
    assert ours.of(headers(("x-api-key", "k" * 8)), None).value == "k" * 8
    with pytest.raises(BadIdentity) as caught:
        ours.of(headers(("x-api-key", "k" * 9)), None)
    assert caught.value.status == 431 and "9 bytes" in caught.value.detail
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("peer", "expected"),
    [
        ("192.0.2.1", "192.0.2.1"),
        ("2001:db8::1", "2001:db8::/64"),
        ("::ffff:192.0.2.1", "192.0.2.1"),
        ("fe80::1%eth0", "fe80::/64"),
        ("not-an-address", "not-an-address"),  # (a test client's name, a Unix socket)
        ("", "unknown"),
        (None, "unknown"),
    ],
)
def test_the_peer_counts_as_its_grouped_address(peer, expected):
    ours = RequestIdentity()
    assert ours.address([], peer) == expected
    assert ours.address([], peer) == expected  # the second time from the peer cache
    assert ours.of([], peer) == ClientIdentity("address", expected)


def test_forwarded_for_is_read_only_from_trusted_proxies():
    forwarded = headers(("x-forwarded-for", "198.51.100.1, 10.0.0.3"))
    ours = RequestIdentity(trusted_proxies=["10.0.0.0/8"])
    assert ours.address(forwarded, "10.0.0.2") == "198.51.100.1"
    assert ours.address(forwarded, "203.0.113.9") == "203.0.113.9"
    # Several header lines are one list, read right to left.
    split = headers(("x-forwarded-for", "198.51.100.1"), ("x-forwarded-for", "10.0.0.3"))
    assert ours.address(split, "10.0.0.2") == "198.51.100.1"
    assert ours.trusted(ipaddress.ip_address("10.1.2.3"))
    assert not ours.trusted(ipaddress.ip_address("11.0.0.1"))


def test_options_are_checked_when_built():
    with pytest.raises(ValueError, match="trusted_proxies"):
        RequestIdentity(trusted_proxies=["10.0.0.0/8", "proxy.example"])
    with pytest.raises(ValueError, match="ipv6_prefix"):
        RequestIdentity(ipv6_prefix=129)
    with pytest.raises(ValueError, match="max_api_key_bytes"):
        RequestIdentity(max_api_key_bytes=0)
    assert identity.trusted_networks("10.0.0.1") == (ipaddress.ip_network("10.0.0.1/32"),)


@pytest.mark.parametrize(
    ("address", "prefix", "expected"),
    [
        ("192.0.2.1", 64, "192.0.2.1"),
        ("2001:db8::1", 64, "2001:db8::/64"),
        ("2001:db8::1", 48, "2001:db8::/48"),
        ("2001:db8::1%eth0", 128, "2001:db8::1"),
        ("::ffff:198.51.100.7", 64, "198.51.100.7"),
        (ipaddress.ip_address("2001:db8::ff"), 64, "2001:db8::/64"),
    ],
)
def test_address_identity(address, prefix, expected):
    assert identity.address_identity(address, prefix) == expected


def test_address_identity_refuses_what_is_not_an_address():
    with pytest.raises(ValueError):
        identity.address_identity("198.51.100")
    with pytest.raises(ValueError, match="ipv6_prefix"):
        identity.address_identity("2001:db8::1", 0)


@pytest.mark.parametrize(
    "text",
    ["192.0.2.1", "192.0.2.1:443", "[2001:db8::1]:443", '"192.0.2.1"', " 192.0.2.1 "],
)
def test_parse_ip_reads_ports_brackets_and_quotes(text):
    assert identity.parse_ip(text) is not None


def test_parse_ip_answers_none_for_anything_else():
    assert identity.parse_ip("garbage") is None
    assert identity.parse_ip("") is None


def test_route_identity_is_the_prefix_and_the_value():
    assert identity.route_identity("geofence", "key", "demo") == "geofence:key:demo"
    assert identity.route_identity_prefix("tiles", "address") == "tiles:address:"
    with pytest.raises(ValueError, match="kind"):
        identity.route_identity_prefix("tiles", "user")
    # The Redis key of a route's client is made from that identity, in `keys`.
    limiter_key = keys.make_key("rl", "logc", "geofence:key:demo", window_ms=1000)
    assert keys.route_key("demo", scope="geofence", window_ms=1000) == limiter_key
    # A route with another window keeps another key (tiers never share one).
    assert keys.route_key("demo", scope="geofence", window_ms=60_000) != limiter_key
