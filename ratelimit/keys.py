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

`plain_key` is the other layout, `<prefix>:<identity>` with the identity as it is
(a limiter's `plain_keys=True`): the key a person types, e.g. "rl:geofence:key:demo"
for the demo's geofence route. It gives up what the digest gives: the identity must
be short text without characters that would change the key's meaning or its cluster
slot, it is stored readable, and the key names neither the algorithm nor the window,
so a prefix with plain keys must belong to one policy (two limiters with other
windows or algorithms on one prefix would share, and corrupt, one key).

A route limited by `ratelimit.http` asks its limiter about
`ratelimit.identity.route_identity(scope, kind, value)`, e.g. "geofence:key:demo", not
about the API key alone, so that routes never share a budget (how a request's identity
is derived is `ratelimit.identity`'s). `route_key` gives the Redis key of an API key (or
an address) on a route without building the app, as `python -m ratelimit key` does:

    route_key("demo", scope="geofence", prefix="demo", window_ms=1000)   # 'demo:logc:1000:{...}'
"""

from __future__ import annotations

import base64
import hashlib
import re

from . import algorithms, validation
from .identity import route_identity

READABLE_CHARS = 24
_UNSAFE = re.compile(r"[^A-Za-z0-9._@-]")
# A plain key's identity: at most this many characters, none of `_NOT_PLAIN` (space,
# braces that steer a cluster slot, glob characters that change what a pattern matches,
# quotes and the backslash that change what a shell or redis-cli reads) and nothing
# unprintable (control characters, other spaces).
PLAIN_MAX_CHARS = 512  # (an HTTP route's 256-byte API key fits, with its scope)
_NOT_PLAIN = re.compile(r"[ {}*?\[\]\\\"']")


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
    window_ms: int,
    secret: bytes | None = None,
    readable: bool = False,
) -> str:
    """`<prefix>:<algorithm>:<window_ms>:{<digest>}`, or with `readable`
    `...:<window_ms>:<excerpt>:{<digest>}`.

    The algorithm (the log's storage included) and the window are in the key because
    limiters that differ in either keep state the other cannot read: a per-second and a
    per-hour tier of one identity must not trim each other's history. The limit is not:
    a limit changed on a live key (a deploy) reads the history the old one wrote."""
    tag = "{" + digest(identity, secret) + "}"
    if readable:
        return f"{prefix}:{algorithm}:{window_ms}:{readable_excerpt(identity)}:{tag}"
    return f"{prefix}:{algorithm}:{window_ms}:{tag}"


def plain_key(prefix: str, identity: str | bytes) -> str:
    """`<prefix>:<identity>`: the identity as it is, for keys a person types. ValueError
    for an identity that is not short, printable text without spaces, braces, glob
    characters, quotes or backslashes (see `PLAIN_MAX_CHARS`)."""
    if not isinstance(identity, str):
        raise ValueError(
            f"with plain_keys an identity must be str, got {type(identity).__name__}"
        )
    if not identity:
        raise ValueError("identity must not be empty")
    if len(identity) > PLAIN_MAX_CHARS:
        raise ValueError(
            f"with plain_keys an identity is at most {PLAIN_MAX_CHARS} characters, "
            f"got {len(identity)}"
        )
    bad = _NOT_PLAIN.search(identity)
    if bad is not None or not identity.isprintable():
        what = bad[0] if bad is not None else next(c for c in identity if not c.isprintable())
        raise ValueError(
            f"with plain_keys an identity may not hold {what!r}: spaces, braces, glob "
            "characters, quotes, backslashes and unprintable characters would change "
            "what the key means, or its cluster slot (hashed keys, the default, take any "
            "identity)"
        )
    return f"{prefix}:{identity}"


def route_key(
    api_key: str | None = None,
    *,
    address: str | None = None,
    scope: str = "default",
    prefix: str = "rl",
    algorithm: str = "logc",
    window_ms: int,
    secret: bytes | None = None,
    readable: bool = False,
    plain: bool = False,
) -> str:
    """The Redis key holding the budget of `api_key` (or of a client `address`, an IPv6
    one as its network, e.g. "2001:db8::/64") on the route `scope`, for a limiter built
    with `prefix`, `algorithm` ("logc": the sliding log's default storage; "log" with
    storage="sorted-set", "fw", "swc", "gcra"), a window of `window_ms` (required:
    another window is another key),
    `key_secret=secret`, `readable_keys=readable` and `plain_keys=plain`: the key that
    route's `RateLimit.key_for(api_key)` names."""
    if (api_key is None) == (address is None):
        raise ValueError("give exactly one of api_key and address")
    kind, value = ("key", api_key) if api_key is not None else ("address", address)
    identity = route_identity(scope, kind, value)  # type: ignore[arg-type]
    if plain:
        return plain_key(validation.prefix(prefix), identity)
    tag = algorithms.get(algorithm).name
    return make_key(
        validation.prefix(prefix),
        tag,
        identity,
        window_ms=validation.window_ms(None, window_ms),
        secret=validate_secret(secret),
        readable=readable,
    )
