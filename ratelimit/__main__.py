"""The library's command line: `python -m ratelimit COMMAND ...`.

    python -m ratelimit key demo --scope geofence --prefix demo
    demo:log:{GYTthtZt6_IjW9bBdrPKFw}

`key` prints the Redis key that holds a client's budget on a route limited by
`ratelimit.http`, for `redis-cli` (`ZCARD`, `PTTL`, ...); in Python,
`ratelimit.keys.route_key(api_key, scope=..., prefix=..., algorithm=...)`. Each command
is one function `_<name>(args) -> exit status`, registered in `parser()`.
"""

from __future__ import annotations

import argparse
import sys

from . import algorithms, keys

# Every tag a limiter puts in its keys: the four algorithms and the compact log.
_ALGORITHMS = [*algorithms.NAMES, algorithms.COMPACT_LOG.name]


def _key(args: argparse.Namespace) -> int:
    print(
        keys.route_key(
            args.api_key,
            address=args.address,
            scope=args.scope,
            prefix=args.prefix,
            algorithm=args.algorithm,
            readable=args.readable_keys,
        )
    )
    return 0


def parser() -> argparse.ArgumentParser:
    """The command line's parser: one subcommand per task."""
    main = argparse.ArgumentParser(
        prog="python -m ratelimit", description="Tools for the ratelimit library."
    )
    commands = main.add_subparsers(dest="command", required=True, metavar="COMMAND")

    key = commands.add_parser(
        "key",
        help="print the Redis key of a client's budget on a route",
        description="Print the Redis key that holds the budget of API_KEY (or of "
        "--address) on the route whose scope is --scope, as ratelimit.http keys it. "
        "Limiters built with key_secret= make keys this command cannot reproduce.",
    )
    key.add_argument("api_key", nargs="?", metavar="API_KEY", help="the x-api-key value")
    key.add_argument(
        "--address",
        help="a client without an API key: its address (an IPv6 one as its /64 network, "
        "e.g. 2001:db8::/64)",
    )
    key.add_argument(
        "--scope", default="default", help="the route's scope, its policy name (default: default)"
    )
    key.add_argument(
        "--prefix", default="rl", help="the limiter's key prefix (default: rl; the demo's: demo)"
    )
    key.add_argument(
        "--algorithm",
        default=algorithms.SLIDING_LOG.name,
        choices=_ALGORITHMS,
        help="the limiter's algorithm tag (default: log; logc is the compact log)",
    )
    key.add_argument(
        "--readable-keys", action="store_true", help="the limiter has readable_keys=True"
    )
    key.set_defaults(run=_key, parser=key)
    return main


def main(argv: list[str] | None = None) -> int:
    """Run one command; bad arguments exit with status 2 and a message, as argparse does."""
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except ValueError as exc:
        args.parser.error(str(exc))  # the command's usage and the message; exits


if __name__ == "__main__":
    sys.exit(main())
