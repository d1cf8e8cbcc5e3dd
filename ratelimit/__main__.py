"""The library's command line: `python -m ratelimit COMMAND ...`.

    python -m ratelimit key demo --scope geofence --prefix svc --algorithm log --window-ms 1000
    svc:log:1000:{GYTthtZt6_IjW9bBdrPKFw}

`key` prints the Redis key that holds a client's budget on a route limited by
`ratelimit.http`, for `redis-cli` (`ZCARD`, `PTTL`, ...); in Python,
`ratelimit.keys.route_key(api_key, scope=..., prefix=..., algorithm=..., window_ms=...)`.
Each command is one function `_<name>(args) -> exit status`, registered in `parser()`.
"""

from __future__ import annotations

import argparse
import sys

from . import __version__, algorithms, keys

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
            window_ms=args.window_ms,
            readable=args.readable_keys,
            plain=args.plain_keys,
        )
    )
    return 0


def _acl(args: argparse.Namespace) -> int:
    from . import acl  # only this command needs it

    print(
        acl.rule(
            args.prefix or ["rl"],
            user=args.user,
            db=args.db,
            wait_replicas=args.wait_replicas,
            health_check=args.health_check,
            cluster=args.cluster,
        )
    )
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import doctor  # only this command needs it

    report = doctor(args.url, timeout=args.timeout, clock_threshold_ms=args.clock_threshold_ms)
    print(report)
    return report.exit_code


def parser() -> argparse.ArgumentParser:
    """The command line's parser: one subcommand per task."""
    main = argparse.ArgumentParser(
        prog="python -m ratelimit", description="Tools for the ratelimit library."
    )
    main.add_argument("--version", action="version", version=f"ratelimit-lab {__version__}")
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
        default=algorithms.LOG_STORAGES[algorithms.DEFAULT_LOG_STORAGE].name,
        choices=_ALGORITHMS,
        help="the limiter's algorithm tag (default: logc, the sliding log's default "
        "storage; log is its storage=sorted-set)",
    )
    key.add_argument(
        "--window-ms",
        type=int,
        required=True,
        help="the limiter's window in ms (the demo's is 1000): the window is part of the "
        "key, so tiers with other windows keep other keys",
    )
    key.add_argument(
        "--readable-keys", action="store_true", help="the limiter has readable_keys=True"
    )
    key.add_argument(
        "--plain-keys",
        action="store_true",
        help="the limiter has plain_keys=True: the key is PREFIX:SCOPE:key:API_KEY "
        "(the demo's, e.g. rl:geofence:key:demo); algorithm and window are not in it",
    )
    key.set_defaults(run=_key, parser=key)

    acl = commands.add_parser(
        "acl",
        help="print the Redis ACL rule a limiter needs",
        description="Print the least-privilege ACL rule for limiters with key prefix "
        "--prefix: their key pattern and only the commands they send and their scripts "
        "call. With --user, the whole ACL SETUSER command (replace <password>).",
    )
    acl.add_argument(
        "--prefix",
        action="append",
        help="a limiter's key prefix (default: rl); repeat it for several",
    )
    acl.add_argument("--user", help="print ACL SETUSER for this user name")
    acl.add_argument("--db", type=int, default=0, help="the database the limiters use (default: 0)")
    acl.add_argument(
        "--wait-replicas",
        type=int,
        default=0,
        help="the limiters' wait_replicas option (default: 0; more adds +wait)",
    )
    acl.add_argument(
        "--health-check",
        action="store_true",
        help="the URL sets health_check_interval (redis-py then sends PING: adds +ping)",
    )
    acl.add_argument(
        "--cluster",
        action="store_true",
        help="for a Redis Cluster (adds +cluster|slots +command; set it on every node)",
    )
    acl.set_defaults(run=_acl, parser=acl)

    doctor = commands.add_parser(
        "doctor",
        help="check the Redis a limiter uses, and warn on risky settings",
        description="Report what matters for rate limits on the Redis at URL (default: "
        "REDIS_URL, else the embedded fakeredis): version, maxmemory and its policy, "
        "persistence, replication, cluster mode, the offset between this host's clock "
        "and Redis's, and whether the scripts load. Exit status: 0 all ok, 1 warnings, "
        "2 errors or Redis unreachable.",
    )
    doctor.add_argument("url", nargs="?", metavar="URL", help="a redis://, rediss:// or "
                        "redis+cluster:// URL")  # fmt: skip
    doctor.add_argument(
        "--timeout", type=float, default=2.0, help="seconds to wait for Redis (default: 2)"
    )
    doctor.add_argument(
        "--clock-threshold-ms",
        type=float,
        default=50.0,
        help="warn when the clocks differ by more (default: 50)",
    )
    doctor.set_defaults(run=_doctor, parser=doctor)
    return main


def main(argv: list[str] | None = None) -> int:
    """Run one command; bad arguments exit with status 2 and a message, as argparse does."""
    args = parser().parse_args(argv)
    try:
        status: int = args.run(args)
        return status
    except ValueError as exc:
        args.parser.error(str(exc))  # the command's usage and the message; exits
        raise  # not reached: error() exits


if __name__ == "__main__":
    sys.exit(main())
