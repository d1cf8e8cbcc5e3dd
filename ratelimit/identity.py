"""Who a request counts against: an HTTP request's identity, and what a limiter is asked.

A route limited by `ratelimit.http` tells its clients apart by an API key header, else
by the client's address (`RequestIdentity`, built once per route):

- the API key header (`x-api-key` by default), when present and not empty; a key
  longer than `max_api_key_bytes` or more than one such header is refused
  (`BadIdentity`, which the HTTP layer answers 431 or 400);
- else the peer's address, or, when the peer is one of `trusted_proxies`, the
  right-most `X-Forwarded-For` entry that is not itself a trusted proxy (whatever a
  client writes to the left of what its proxies appended changes nothing);
- an address counts as `address_identity` says: IPv4 as itself, IPv6 per /64.

The limiter is then asked about `route_identity(scope, kind, value)`, e.g.
"geofence:key:demo", so that routes never share a budget; `ratelimit.keys` turns
that text into a Redis key. The lab's access-log reader counts addresses with the same
`address_identity`, so a plan and the live route agree on who is one client.

Nothing here imports a web framework: `RequestIdentity.of` reads the raw ASGI header
list and the peer's host, as every ASGI server hands them over.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from . import validation

__all__ = [
    "API_KEY_HEADER",
    "IDENTITY_KINDS",
    "MAX_API_KEY_BYTES",
    "BadIdentity",
    "ClientIdentity",
    "RequestIdentity",
    "address_identity",
    "parse_ip",
    "route_identity",
    "route_identity_prefix",
    "trusted_networks",
]

API_KEY_HEADER = "x-api-key"
"""The request header an API key comes in, unless `rate_limit(api_key_header=...)` names another."""
MAX_API_KEY_BYTES = 256
"""A longer API key is refused (431) before it reaches Redis."""
MAX_HEADER_BYTES = 65_536  # more than any server accepts in one header field
IDENTITY_KINDS = ("key", "address")
"""How a route tells its clients apart: an API key, else the client's address."""
UNKNOWN_PEER = "unknown"
_PEER_CACHE = 4096  # peers remembered per route (their parsed, grouped address)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class ClientIdentity:
    """Who a request is counted against: an API key, or a client address."""

    kind: Literal["key", "address"]
    value: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.value}"


class BadIdentity(ValueError):
    """A request whose identity cannot be used: `status` 400 (more than one API key)
    or 431 (an API key too long), with a `title` and a `detail` for the client."""

    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.title = title
        self.detail = detail


def address_identity(address: str | IPAddress, ipv6_prefix: int = 64) -> str:
    """The identity a client address counts under: an IPv4 address as itself, an IPv6
    address as its network of `ipv6_prefix` bits (1..128; 128 keeps the address), e.g.
    "2001:db8::/64", since one client usually holds a whole /64. An IPv4-mapped IPv6
    address counts as its IPv4 address, and a zone ("%eth0") is dropped. Text that is
    not an address raises ValueError."""
    ipv6_prefix = validation.positive_int("ipv6_prefix", ipv6_prefix, 128)
    ip = address if not isinstance(address, str) else ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        if ipv6_prefix < 128:
            return str(ipaddress.IPv6Network((ip.packed, ipv6_prefix), strict=False))
        return str(ipaddress.IPv6Address(ip.packed))  # without the zone
    return str(ip)


def route_identity_prefix(scope: str, kind: str) -> str:
    """`<scope>:<kind>:`, what every identity of that kind on route `scope` starts with."""
    if kind not in IDENTITY_KINDS:
        raise ValueError(f"kind must be one of {IDENTITY_KINDS}, got {kind!r}")
    return f"{scope}:{kind}:"


def route_identity(scope: str, kind: str, value: str) -> str:
    """What a route of `ratelimit.http` asks its limiter about: `<scope>:<kind>:<value>`,
    e.g. "geofence:key:demo" for API key "demo" on the route whose scope is "geofence"."""
    return route_identity_prefix(scope, kind) + value


def trusted_networks(values: Iterable[str] | str) -> tuple[Network, ...]:
    """Addresses or networks ("10.0.0.0/8") as networks; ValueError for anything else."""
    if isinstance(values, str):
        values = [values]
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(str(value).strip(), strict=False))
        except ValueError:
            raise ValueError(
                f"trusted_proxies must hold IP addresses or networks, got {value!r}"
            ) from None
    return tuple(networks)


def parse_ip(text: str) -> IPAddress | None:
    """An address from a peer or an X-Forwarded-For entry (ports and brackets allowed);
    None when the text is not one."""
    text = text.strip().strip('"')
    if text.startswith("["):  # "[2001:db8::1]:443"
        text = text[1:].split("]", 1)[0]
    elif text.count(":") == 1:  # "192.0.2.1:443"
        text = text.split(":", 1)[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.scope_id is not None:  # "fe80::1%eth0": the zone names our interface, not
            return ipaddress.IPv6Address(ip.packed)  # the client; "%1", "%2" are one host
    return ip


Headers = Sequence[tuple[bytes, bytes]] | Iterable[tuple[bytes, bytes]]


class RequestIdentity:
    """How one route derives a request's `ClientIdentity` (see the module doc); built
    once per route, asked once per request (`of`)."""

    def __init__(
        self,
        *,
        api_key_header: str | None = API_KEY_HEADER,
        max_api_key_bytes: int = MAX_API_KEY_BYTES,
        trusted_proxies: Iterable[str] | str = (),
        ipv6_prefix: int = 64,
    ) -> None:
        self.api_key_header = api_key_header.lower().encode("latin-1") if api_key_header else None
        self.max_api_key_bytes = validation.positive_int(
            "max_api_key_bytes", max_api_key_bytes, MAX_HEADER_BYTES
        )
        self.ipv6_prefix = validation.positive_int("ipv6_prefix", ipv6_prefix, 128)
        self.trusted_proxies = trusted_networks(trusted_proxies)
        # A peer's host text -> (its address or None, trusted?, its grouped identity):
        # a server sees the same few peers again and again, and parsing an address
        # costs more than the rest of the identity.
        self._peer = lru_cache(maxsize=_PEER_CACHE)(self._parse_peer)

    def of(self, headers: Headers, peer_host: str | None) -> ClientIdentity:
        """The identity of a request with these raw ASGI `headers` (lower-case names,
        as ASGI servers pass them; other cases are matched too) from `peer_host`
        (None: no peer known). `BadIdentity` when its API key cannot be used."""
        name = self.api_key_header
        if name is not None:
            size = len(name)
            found = None
            for key, value in headers:
                if len(key) == size and (key == name or key.lower() == name):
                    if found is not None:
                        raise BadIdentity(400, "Bad Request", "send at most one API key header")
                    found = value
            if found is not None:
                found = found.strip()
                if found:
                    if len(found) > self.max_api_key_bytes:
                        raise BadIdentity(
                            431,
                            "Request Header Fields Too Large",
                            f"the API key is {len(found)} bytes long; at most "
                            f"{self.max_api_key_bytes} are accepted",
                        )
                    return ClientIdentity("key", found.decode("latin-1"))
        return ClientIdentity("address", self.address(headers, peer_host))

    def address(self, headers: Headers, peer_host: str | None) -> str:
        """The client's address as it counts: the peer's, or what trusted proxies say
        they forwarded for; `peer_host` itself when it is not an address."""
        if not peer_host:
            return peer_host if peer_host is not None and peer_host else UNKNOWN_PEER
        peer, trusted, grouped = self._peer(peer_host)
        if peer is None:
            return peer_host
        if not trusted:
            return grouped
        address = peer
        forwarded = b",".join(v for k, v in headers if k == b"x-forwarded-for")
        hops = [hop for hop in forwarded.decode("latin-1").split(",") if hop.strip()]
        # Right to left: each trusted hop vouches for the entry before it. Stop at the
        # first hop that is not a trusted proxy; anything further left is the client's
        # own say. An entry that is not an address ends the walk at the hop that wrote it.
        for hop in reversed(hops):
            ip = parse_ip(hop)
            if ip is None:
                break
            address = ip
            if not self.trusted(ip):
                break
        return address_identity(address, self.ipv6_prefix)

    def trusted(self, ip: IPAddress) -> bool:
        """Whether `ip` is one of the trusted proxies."""
        return any(ip in network for network in self.trusted_proxies)

    def _parse_peer(self, host: str) -> tuple[IPAddress | None, bool, str]:
        ip = parse_ip(host)
        if ip is None:
            return None, False, host
        return ip, self.trusted(ip), address_identity(ip, self.ipv6_prefix)
