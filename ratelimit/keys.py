"""Redis keys for identities: bounded, collision-free, and not readable by default.

An identity (an API key, a client address) can be any text or bytes of any length.
The key holds a 128-bit BLAKE2b digest of it inside a hash tag, so

- its length is fixed whatever the identity (a 10 kB identity gives a short key);
- two identities never share a key (collisions are cryptographically unlikely);
- the Redis Cluster slot is computed from the digest alone, so braces in the
  identity cannot steer which shard it lands on;
- a raw API key is not stored readable in Redis. With `secret`, the digest is
  keyed, so even a guessable identity cannot be recovered from its key.

`readable=True` adds a short, escaped excerpt of the identity for people reading
the keyspace; the digest still makes the key unique.

A route limited by `ratelimit.http` asks its limiter about `route_identity(scope,
kind, value)`, e.g. "geofence:key:demo", not about the API key alone, so that routes
never share a budget. `route_key` gives the Redis key of an API key (or an address) on
a route without building the app, as `python -m ratelimit key` does:

    route_key("demo", scope="geofence", prefix="demo")   # 'demo:log:{...}'
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import re

from . import algorithms, validation

READABLE_CHARS = 24
_UNSAFE = re.compile(r"[^A-Za-z0-9._@-]")


def identity_bytes(identity: str | bytes) -> bytes:
    """The identity as bytes; ValueError for anything that is not non-empty text or bytes."""
    if isinstance(identity, str):
        data = identity.encode("utf-8", "surrogatepass")
    elif isinstance(identity, bytes | bytearray | memoryview):
        data = bytes(identity)
    else:
        raise ValueError(f"identity must be str or bytes, got {type(identity).__name__}")
    if not data:
        raise ValueError("identity must not be empty")
    return data


def validate_secret(secret: object) -> bytes | None:
    """A digest key: None, or 1 to 64 bytes (BLAKE2b's key size)."""
    if secret is None:
        return None
    if not isinstance(secret, bytes) or not 1 <= len(secret) <= 64:
        raise ValueError("key_secret must be None or 1 to 64 bytes")
    return secret


def digest(identity: str | bytes, secret: bytes | None = None) -> str:
    """URL-safe base64 of the identity's 128-bit BLAKE2b digest (22 characters)."""
    raw = hashlib.blake2b(identity_bytes(identity), digest_size=16, key=secret or b"").digest()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def readable_excerpt(identity: str | bytes) -> str:
    """A short excerpt of the identity with every unusual character escaped."""
    text = identity_bytes(identity)[: READABLE_CHARS * 4].decode("utf-8", "replace")
    escaped = _UNSAFE.sub(lambda m: "%" + "%".join(f"{b:02X}" for b in m[0].encode()), text)
    return escaped[:READABLE_CHARS]


def make_key(
    prefix: str,
    algorithm: str,
    identity: str | bytes,
    *,
    secret: bytes | None = None,
    readable: bool = False,
) -> str:
    """`<prefix>:<algorithm>:{<digest>}`, or with `readable` `...:<excerpt>:{<digest>}`."""
    tag = "{" + digest(identity, secret) + "}"
    if readable:
        return f"{prefix}:{algorithm}:{readable_excerpt(identity)}:{tag}"
    return f"{prefix}:{algorithm}:{tag}"


def address_identity(
    address: str | ipaddress.IPv4Address | ipaddress.IPv6Address, ipv6_prefix: int = 64
) -> str:
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


IDENTITY_KINDS = ("key", "address")
"""How a route tells its clients apart: an API key, else the client's address."""


def route_identity(scope: str, kind: str, value: str) -> str:
    """What a route of `ratelimit.http` asks its limiter about: `<scope>:<kind>:<value>`,
    e.g. "geofence:key:demo" for API key "demo" on the route whose scope is "geofence"."""
    if kind not in IDENTITY_KINDS:
        raise ValueError(f"kind must be one of {IDENTITY_KINDS}, got {kind!r}")
    return f"{scope}:{kind}:{value}"


def route_key(
    api_key: str | None = None,
    *,
    address: str | None = None,
    scope: str = "default",
    prefix: str = "rl",
    algorithm: str = "logc",
    secret: bytes | None = None,
    readable: bool = False,
) -> str:
    """The Redis key holding the budget of `api_key` (or of a client `address`, an IPv6
    one as its network, e.g. "2001:db8::/64") on the route `scope`, for a limiter built
    with `prefix`, `algorithm` ("logc": the sliding log's default storage; "log" with
    storage="sorted-set", "fw", "swc", "gcra"),
    `key_secret=secret` and `readable_keys=readable`: the key that route's
    `RateLimit.key_for(api_key)` names."""
    if (api_key is None) == (address is None):
        raise ValueError("give exactly one of api_key and address")
    kind, value = ("key", api_key) if api_key is not None else ("address", address)
    identity = route_identity(scope, kind, value)  # type: ignore[arg-type]
    tag = algorithms.get(algorithm).name
    return make_key(
        validation.prefix(prefix), tag, identity, secret=validate_secret(secret), readable=readable
    )
