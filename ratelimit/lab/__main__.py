"""The lab's command line: `python -m ratelimit.lab COMMAND ...`.

    python -m ratelimit.lab plan access.log --limit 100/min --limit 1000/h --json plan.json
    python -m ratelimit.lab plan                     # the lab's example log, 100/min
    python -m ratelimit.lab example-log access.log   # write the example log to keep

`plan` reads an access log once and reports, for each candidate limit and algorithm,
whom it would hurt and what Redis it needs (`ratelimit.lab.planner`, where every
figure and the JSON document's fields are defined). Each command is one function
`_<name>(args) -> exit status`, registered in `parser()`. Exit status: 0 done, 1 the
log could not be read or the output not written (one line says why), 2 bad options.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ratelimit import algorithms

from . import planner
from .planner.sources import ENGINES

PROG = "python -m ratelimit.lab"
DEFAULT_LIMIT = "100/min"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip


class _Failed(Exception):
    """The command could not do its work (exit status 1, one line to stderr)."""


def _limit(text: str) -> str:
    try:
        planner.parse_limit(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _size(text: str) -> float:
    found = _SIZE.match(text)
    if found is None or float(found[1]) <= 0:
        raise argparse.ArgumentTypeError(
            f"cannot read the size {text!r}: give a number of bytes with an optional unit, "
            "e.g. 14GiB, 512MiB, 16GB (GiB = 2**30 bytes, GB = 10**9)"
        )
    return float(found[1]) * _SIZE_UNITS[(found[2] or "b").lower()]


def _headroom(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(
            f"headroom must be a share from 0 to below 1 (0.5 keeps half free), got {text!r}"
        )
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text!r}")
    return value


def _whole(name: str) -> Callable[[str], int]:
    """An argparse type: a whole number >= 0, refused naming the option `name`."""

    def parse(text: str) -> int:
        if not text.isdigit():
            raise argparse.ArgumentTypeError(f"{name} must be a whole number >= 0, got {text!r}")
        return int(text)

    return parse


_top = _whole("top")
_chunks_ahead = _whole("read-ahead")


def _route(text: str) -> Any:
    from .planner import routes

    try:
        return routes.parse_route(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _affect(text: str) -> float | None:
    from .planner import recommend

    if text.strip().lower() == "none":
        return None
    try:
        return recommend.parse_affect(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _where(text: str) -> Any:
    from .planner import routes

    try:
        return routes.parse_where(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cost(text: str) -> Any:
    from .planner import routes

    try:
        return routes.parse_cost(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _export_tables() -> tuple[str, ...]:
    from .planner.export import CSV_TABLES

    return CSV_TABLES


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return int(text)


def _paragraphs(*texts: str) -> str:
    return "\n\n".join(textwrap.fill(text, 79) for text in texts)


def _say(message: str) -> None:
    print(message, file=sys.stderr)


def _plan(args: argparse.Namespace) -> int:
    if args.log and args.example:
        args.parser.error("give LOG or --example, not both")
    if args.route and args.limit:
        args.parser.error("give --limit or --route, not both: each route carries its own limit")
    if args.plot is not None:
        from .planner.export import check_figure_path

        check_figure_path(args.plot)  # before the log is read
    if args.engine != "dask" and (args.scheduler is not None or args.workers is not None):
        args.parser.error("--scheduler and --workers go with --engine dask")
    limits = args.limit or [DEFAULT_LIMIT]
    options = {
        "format": args.format,
        "identity": args.identity,
        "cost": args.cost,
        "time": args.time,
        "reorder_s": args.reorder,
        "read_ahead": args.read_ahead,
        "redis_url": args.redis,
        "measure": not args.no_measure,
        "headroom": args.headroom,
        "shard_memory_bytes": args.shard_memory,
        "top": args.top,
        "progress": False if args.no_progress else None,
        "bench_record": args.bench_record,
        "affect": args.affect,
        "spread_coarse": not args.no_spread,
    }
    algos = args.algorithm or list(planner.DEFAULT_ALGORITHMS)
    if not args.log or args.example:
        from . import samplelog

        _say(
            ("" if args.example else "No LOG given: ")
            + "planning the lab's example log (synthetic traffic). Give a path to plan your "
            f"own; `{PROG} example-log FILE` writes the example to keep."
        )
        # Its clients are API keys (the user field), and geofence look-ups cost by radius.
        options["identity"] = args.identity or "user"
        options["cost"] = args.cost or samplelog.example_cost
        with tempfile.TemporaryDirectory(prefix="ratelimit-example-") as folder:
            path = samplelog.write_example(Path(folder) / "example.log")
            plan = _planned([path], limits, algos, options, example=True, args=args)
    else:
        plan = _planned(args.log, limits, algos, options, example=False, args=args)
    problems = plan.log.problems if isinstance(plan, planner.LogPlan) else plan.log["problems"]
    if problems:
        _say(problems if isinstance(problems, str) else problems.summary())
    print(plan.table(problems=False))
    if args.json is not None:
        try:
            Path(args.json).write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
        except OSError as exc:
            raise _Failed(f"cannot write {args.json}: {exc.strerror or exc}") from None
        _say(f"Wrote the plan to {args.json}")
    _export(plan, args)
    return 0


def _chosen(args: argparse.Namespace) -> dict:
    """--route and --where, as `_planned` takes them."""
    return {"routes": args.route or [], "where": args.where or []}


def _export(plan: Any, args: argparse.Namespace) -> None:
    """--csv DIR and --plot FILE. A plan by route writes `routes.csv` and each route's
    tables in DIR/ROUTE/, and each route's figures to FILE's stem + "-ROUTE"."""
    from .planner import export

    if isinstance(plan, planner.LogPlan):
        each = [(plan, args.csv, args.plot)]
    else:
        each = [
            (r.plan, args.csv and Path(args.csv) / r.name,
             args.plot and Path(args.plot).with_stem(f"{Path(args.plot).stem}-{r.name}"))
            for r in plan.routes if r.plan is not None
        ]  # fmt: skip
    try:
        if args.csv is not None and not isinstance(plan, planner.LogPlan):
            Path(args.csv).mkdir(parents=True, exist_ok=True)
            plan.frame().to_csv(Path(args.csv) / "routes.csv", index=False)
        for one, folder, figure in each:
            if folder:
                written = export.write_csv(one, folder)
                _say(f"Wrote {len(written)} tables to {folder} "
                     f"({', '.join(p.name for p in written)})")  # fmt: skip
            if figure:
                export.write_figure(one, figure)
                _say(f"Wrote the figures to {figure}")
    except OSError as exc:
        raise _Failed(f"cannot write {exc.filename or args.csv}: {exc.strerror or exc}") from None


def _planned(logs, limits, algos, options, *, example: bool, args) -> Any:
    from . import accesslog
    from .planner import kept, routes, sources

    try:
        paths = sources.expand_logs(logs)
    except ValueError as exc:
        raise _Failed(str(exc)) from None
    where = ", ".join(map(str, logs))
    chosen = _chosen(args)
    if (chosen["routes"] or chosen["where"]) and (len(paths) > 1 or args.engine != "local"):
        raise _Failed("--route and --where plan one log, with the local engine")
    try:
        if chosen["routes"]:
            return routes.plan_routes(
                paths[0], chosen["routes"], algos, where=chosen["where"], example=example,
                **options,
            )  # fmt: skip
        if chosen["where"]:
            return routes.plan_where(
                paths[0], limits, algos, where=chosen["where"], example=example, **options
            )
        if len(paths) == 1 and args.engine == "local":
            return planner.plan_log(paths[0], limits, algos, example=example, **options)
        return sources.plan_logs(
            paths, limits, algos, example=example, engine=args.engine,
            scheduler=args.scheduler, workers=args.workers, **options,
        )  # fmt: skip
    except accesslog.LogFormatError as exc:  # its summary of bad lines has several lines
        raise _Failed("; ".join(part.strip() for part in str(exc).splitlines())) from None
    except kept.NoRoom as exc:
        raise _Failed(str(exc.strerror)) from None
    except OSError as exc:
        raise _Failed(f"cannot read {where}: {exc.strerror or exc}") from None


def _example_log(args: argparse.Namespace) -> int:
    from . import samplelog

    try:
        path = samplelog.write_example(args.out, seed=args.seed)
    except OSError as exc:
        raise _Failed(f"cannot write {args.out}: {exc.strerror or exc}") from None
    _say(f"Wrote the example log to {path}")
    return 0


def parser() -> argparse.ArgumentParser:
    """The command line's parser: one subcommand per task."""
    from . import accesslog
    from .accesslog.formats import TIME_FIELDS

    main = argparse.ArgumentParser(prog=PROG, description="Tools of the rate-limit lab.")
    commands = main.add_subparsers(dest="command", required=True, metavar="COMMAND")

    plan = commands.add_parser(
        "plan",
        help="plan a limit policy on an access log: whom it hurts, what Redis it needs",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_paragraphs(
            "Read an access log once and, for each candidate limit (--limit) and algorithm "
            "(--algorithm), report the requests and identities it would reject, the busiest "
            "identities affected and the most admitted to one identity in any rolling "
            "window; then the Redis plan: keys alive at once, memory (each key at its "
            "identity's peak, from measured bytes per key), checks per second at the peak "
            "(not the mean), server time per check and shards with headroom.",
            "With --route, each route is planned with its own limit and key, one table "
            "row per route and algorithm, and the requests no route matches are counted "
            "as unplanned; --where plans only the requests a filter keeps (see "
            "ratelimit.lab.planner.routes).",
            "It also recommends, per window and algorithm, the smallest limit that rejects "
            "at most --affect of the clients (with the spread of per-client peaks), shows "
            "when requests are rejected (by hour of day, UTC), each client's longest "
            "throttled stretch and the clients rejected most with their user agent, and "
            "states the log's timestamp resolution: when it is coarser than a tenth of a "
            "window, the candidate is replayed with each stamp's requests spread within it.",
            "The table goes to stdout, the log's bad lines (with their line numbers) to "
            "stderr, and --json OUT writes everything as one JSON document (its fields are "
            "documented in ratelimit.lab.planner).",
        ),
        epilog=_paragraphs(
            "Without LOG (or with --example) it plans the lab's example log, a synthetic "
            "Common Log Format file written to a temporary folder, and says so; its clients "
            "are counted by API key (--identity user) and its geofence look-ups cost by "
            "radius, unless --identity or --cost say otherwise. "
            f"`{PROG} example-log FILE` writes the example to keep.",
            "Server time per check is measured on the Redis at --redis (default: REDIS_URL; "
            "no other Redis is ever used) with INFO commandstats, with a few thousand "
            "checks on scratch keys that are deleted afterwards. If neither names a Redis, "
            "none answers within a second, or with --no-measure, it is the figure the latest "
            "`make bench` recorded (bench/record.json). The plan says which, and why.",
            "Exit status: 0 done, 1 the log cannot be read or the JSON not written, 2 bad options.",
        ),
    )
    plan.add_argument(
        "log",
        nargs="*",
        metavar="LOG",
        help="the access log (default: the example log); several logs or quoted globs "
        "('logs/access.log*', gzip or not) are planned as one log, merged in time order",
    )
    plan.add_argument(
        "--example", action="store_true", help="plan the lab's example log (the default)"
    )
    plan.add_argument(
        "--limit",
        action="append",
        type=_limit,
        metavar="N/WINDOW",
        help="a candidate limit, e.g. 100/min, 10/s, 1000/10s, 50/5min (units ms, s, sec, "
        "second, min, minute, h, hour, d, day); repeat for more (default: "
        f"{DEFAULT_LIMIT})",
    )
    plan.add_argument(
        "--algorithm",
        action="append",
        choices=list(algorithms.NAMES),
        help="an algorithm to plan with: log (sliding log), fw (fixed window), swc "
        "(sliding-window counter), gcra (token bucket); repeat for more (default: all four)",
    )
    plan.add_argument(
        "--format",
        choices=list(accesslog.FORMATS),
        help="the log's format (default: detected)",
    )
    plan.add_argument(
        "--identity",
        metavar="FIELD",
        help="the field that names a client, e.g. an API key or user field (default: the "
        "client address; IPv6 clients grouped per /64)",
    )
    plan.add_argument(
        "--cost",
        type=_cost,
        metavar="COST",
        help="each request's cost: an integer field, or a function: MODULE:FUNCTION(NAME) "
        "calls it with the field or query parameter NAME (e.g. "
        "'ratelimit.costs:geofence_cost(radius)'), MODULE:FUNCTION with the line's fields "
        "(a text with a colon is a function; default: every request costs 1)",
    )
    plan.add_argument(
        "--time",
        metavar="FIELD",
        help="jsonl and csv logs: the field holding the time (default: the first of "
        f"{', '.join(TIME_FIELDS)} present)",
    )
    plan.add_argument(
        "--reorder",
        type=_seconds,
        default=300.0,
        metavar="SECONDS",
        help="how far out of time order a line may be and still be decided in order (logs "
        "merged from several servers); a later line is decided where it is read and "
        "counted as late (default: %(default)g)",
    )
    measure = plan.add_mutually_exclusive_group()
    measure.add_argument(
        "--redis",
        metavar="URL",
        help="the Redis to measure server time on (default: REDIS_URL; when neither is "
        "given, nothing is measured)",
    )
    measure.add_argument(
        "--no-measure",
        action="store_true",
        help="do not measure; use the server time `make bench` recorded",
    )
    plan.add_argument(
        "--bench-record",
        metavar="PATH",
        help="the `make bench` record to read server time from (default: bench/record.json "
        "of this repository)",
    )
    plan.add_argument(
        "--headroom",
        type=_headroom,
        default=planner.DEFAULT_SHARD.headroom,
        metavar="SHARE",
        help="share of each shard's memory and time kept free (default: %(default)s)",
    )
    plan.add_argument(
        "--shard-memory",
        type=_size,
        default=planner.DEFAULT_SHARD.memory_gib * 2**30,
        metavar="SIZE",
        help=f"data memory of one Redis shard, e.g. 14GiB, 512MiB, 16GB (default: "
        f"{planner.DEFAULT_SHARD.memory_gib:g}GiB)",
    )
    plan.add_argument(
        "--top",
        type=_top,
        default=10,
        metavar="N",
        help="how many of the busiest affected identities to list (default: %(default)s)",
    )
    plan.add_argument(
        "--json", metavar="OUT", help="also write the whole plan as one JSON document to OUT"
    )
    # Routes and filters (ratelimit.lab.planner.routes).
    plan.add_argument(
        "--route",
        action="append",
        type=_route,
        metavar="PATTERN=RATE",
        help="plan a route with its own limit and key (identity x route), written "
        "PATTERN=RATE[,cost=COST][,name=NAME]: the requests "
        "whose path, without its query, matches the glob PATTERN (fnmatch: * also crosses "
        "/), e.g. '/tiles/*=100/s' and '/within=10/s,cost=ratelimit.costs:geofence_cost"
        "(radius),name=geofence'; COST as --cost (default: --cost, else 1). Repeat for "
        "more; a request goes to the first route it matches, and those matching none are "
        "reported as unplanned. Replaces --limit",
    )
    plan.add_argument(
        "--where",
        action="append",
        type=_where,
        metavar="FILTER",
        help="FIELD=VALUES: plan only the requests whose status, method or path is one of VALUES "
        "(comma-separated): status=2xx, status=200,304, method=GET, 'path=/api/*' (a glob "
        "as for --route); FIELD!=VALUES keeps those it is none of. Repeat: all must hold",
    )
    plan.add_argument(
        "--no-progress", action="store_true", help="no progress bar while reading a long log"
    )
    plan.add_argument(
        "--read-ahead",
        type=_chunks_ahead,
        default=1,
        metavar="CHUNKS",
        help="how many chunks of the log (a million requests each) a thread may read ahead "
        "while the one before is planned, so reading and planning use two cores; 0 reads "
        "and plans in turn, on one (default: 1)",
    )
    # What to answer beyond the candidates: the recommendation, when and who.
    plan.add_argument(
        "--affect",
        type=_affect,
        default=0.01,
        metavar="SHARE",
        help="recommend, per window and algorithm, the smallest limit that rejects at most "
        "this share of clients, e.g. 1%%, 0.5%%, 0.02, or none (default: 1%%); it keeps "
        "every request (20 bytes each, in a temporary file beyond about 40 MiB) to replay "
        "limits on",
    )
    plan.add_argument(
        "--no-spread",
        action="store_true",
        help="when the log's stamps are coarser than a tenth of a window, say so but do not "
        "replay the candidate with each stamp's requests spread within it (with --affect "
        "none, no request is kept in memory)",
    )
    plan.add_argument(
        "--csv",
        metavar="DIR",
        help="also write each table as DIR/NAME.csv: "
        + ", ".join(_export_tables())
        + " (DIR is made if need be)",
    )
    plan.add_argument(
        "--plot",
        metavar="FILE",
        help="also write the figures, in one image: per window the spread of per-client "
        "peaks with the recommended limits, rejections by hour of day, the longest "
        "throttled stretches; the format follows FILE's suffix (.png, .svg, .pdf)",
    )
    # Many logs, and Dask (ratelimit.lab.planner.sources and .distributed).
    plan.add_argument(
        "--engine",
        choices=list(ENGINES),
        default="local",
        help="where to replay: local (this process) or dask (identities spread over a "
        "Dask cluster's workers; the same plan) (default: %(default)s)",
    )
    plan.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="with --engine dask: the scheduler of an existing cluster, e.g. "
        "tcp://10.0.0.5:8786 (default: a local cluster started for this plan)",
    )
    plan.add_argument(
        "--workers",
        type=_positive_int,
        metavar="N",
        help="with --engine dask and no --scheduler: the local cluster's worker processes "
        "(default: the CPUs, at most 4)",
    )
    plan.set_defaults(run=_plan, parser=plan)

    example = commands.add_parser(
        "example-log",
        help="write the lab's example access log",
        description="Write the lab's example access log (Common Log Format, synthetic "
        "traffic from the lab's generators, a few malformed lines on purpose) to OUT.",
    )
    example.add_argument("out", metavar="OUT", help="the file to write")
    example.add_argument(
        "--seed", type=int, default=7, help="the random seed (default: %(default)s)"
    )
    example.set_defaults(run=_example_log, parser=example)
    return main


def main(argv: list[str] | None = None) -> int:
    """Run one command. Bad options exit with status 2 and a message, as argparse does;
    a log that cannot be read, or output that cannot be written, with status 1 and one
    line saying why."""
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except _Failed as exc:
        _say(f"{PROG} {args.command}: error: {exc}")
        return 1
    except ValueError as exc:
        args.parser.error(str(exc))  # the command's usage and the message; exits
    except KeyboardInterrupt:
        _say(f"{PROG} {args.command}: interrupted")
        return 130
    except BrokenPipeError:  # the reader of stdout left (`... | head`): nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
