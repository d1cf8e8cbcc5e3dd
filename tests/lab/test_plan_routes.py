"""Routes, filters and cost functions in the planner (`ratelimit.lab.planner.routes`):
each route's plan equals `plan_trace` on that route's requests picked out by hand, the
filters keep what a row-by-row reading keeps, and every bad option is one clear line."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ratelimit.costs import geofence_cost
from ratelimit.lab import capacity, planner
from ratelimit.lab.planner import routes

ROOT = Path(__file__).resolve().parents[2]
BENCH = planner.ServerTimeChoice(
    "bench", capacity.server_time_from_bench(ROOT / "bench" / "record.json")
)
T0 = 1_796_000_000.0  # a whole second in Unix time
ALGOS = ["log", "fw", "gcra"]
DEMO_ROUTES = [
    "/tiles/*=20/s,name=tiles",
    "/within=10/s,cost=ratelimit.costs:geofence_cost(radius),name=geofence",
]


def demo_trace(seed: int, n: int = 3000, span_s: float = 60.0) -> pd.DataFrame:
    """Requests shaped like the demo API's: tiles, geofence look-ups with a radius (cost
    by `geofence_cost`), health checks, a path two patterns can match, statuses and
    methods of every kind, a few lines without a status or path."""
    rng = np.random.default_rng(seed)
    weights = 1 / np.arange(1, 16)
    who = rng.choice(15, size=n, p=weights / weights.sum())
    ms = np.sort(rng.integers(0, int(span_s * 1000), size=n))
    kind = rng.choice(["tile", "geo", "health", "odd", "none"], size=n, p=[0.55, 0.3, 0.07,
                                                                        0.05, 0.03])  # fmt: skip
    radius = rng.choice([100, 400, 800, 1200, 2500], size=n)
    paths = []
    for k, (z, x), r in zip(kind, rng.integers(0, 9, (n, 2)), radius, strict=True):
        paths.append({
            "tile": f"/tiles/{z}/{x}/{x}.png",
            "geo": f"/within?lat=52.52&lng=13.40&radius={r}",
            "health": "/healthz",
            "odd": "/tiles/within",  # "/tiles/*" and "*within" both match it
            "none": "",
        }[k])  # fmt: skip
    costs = [geofence_cost(r) if k == "geo" else 1 for k, r in zip(kind, radius, strict=True)]
    return pd.DataFrame(
        {
            "time": T0 + ms / 1000,
            "identity": [f"key-{k:02d}" for k in who],
            "cost": np.asarray(costs, dtype=np.int64),
            "replica": np.zeros(n, dtype=np.int64),
            "status": rng.choice(["200", "200", "304", "404", "429", "503", ""], size=n),
            "method": rng.choice(["GET", "GET", "GET", "POST", "get"], size=n),
            "path": paths,
            "agent": "",
        }
    )


# --- by hand: one row at a time, with the standard library ------------------------------


def keeps(condition: str, row: pd.Series) -> bool:
    """One filter, read the way the module docstring states it, on one row."""
    negate = "!=" in condition
    field, values = condition.split("!=" if negate else "=", 1)
    wanted = values.split(",")
    value = str(row[field])
    if field == "status":
        hit = any(
            (len(value) == 3 and value[0] == w[0]) if w.lower().endswith("xx") else value == w
            for w in wanted
        )
    elif field == "method":
        hit = value.upper() in {w.upper() for w in wanted}
    else:
        hit = any(fnmatch.fnmatchcase(value.split("?")[0], w) for w in wanted)
    return hit != negate


def route_by_hand(path: str, patterns: list[str]) -> int:
    bare = path.split("?")[0]
    return next((i for i, p in enumerate(patterns) if fnmatch.fnmatchcase(bare, p)), -1)


def candidates(plan: planner.LogPlan) -> list[dict]:
    return plan.to_dict()["candidates"]


# --- routes on traces -------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2])
def test_each_route_is_planned_on_its_own_requests_as_if_alone(seed):
    frame = demo_trace(seed)
    specs = ["/tiles/*=20/s,name=tiles", "*within=4/s,name=geofence", "/static/*=5/min"]
    where = ["status!=5xx", "method=GET"]
    plan = routes.plan_routes_trace(frame, specs, ALGOS, where=where, server_time=BENCH)

    patterns = ["/tiles/*", "*within", "/static/*"]
    kept = frame[[all(keeps(w, row) for w in where) for _, row in frame.iterrows()]]
    routed = np.array([route_by_hand(p, patterns) for p in kept["path"]])
    assert plan.where == {"conditions": where, "requests_read": len(frame), "kept": len(kept)}
    assert plan.unplanned == int(np.count_nonzero(routed < 0))
    assert plan.unplanned > 0
    limits = [(20, 1.0), (4, 1.0)]
    for i, result in enumerate(plan.routes[:2]):
        alone = kept[routed == i]
        assert result.requests == len(alone) > 0
        expected = planner.plan_trace(alone, [limits[i]], ALGOS, server_time=BENCH)
        assert candidates(result.plan) == candidates(expected)
        assert result.plan.log.identities == expected.log.identities
    # No request goes to /static/*: its route is listed with no plan.
    assert plan.routes[2].requests == 0 and plan.routes[2].plan is None
    assert "no requests" in plan.table()


def test_a_request_two_patterns_match_goes_to_the_first_and_is_counted():
    frame = demo_trace(3)
    both = int(np.count_nonzero(frame["path"] == "/tiles/within"))
    assert both > 0
    forward = routes.plan_routes_trace(
        frame, ["/tiles/*=20/s", "*within=4/s"], ["log"], server_time=BENCH
    )
    backward = routes.plan_routes_trace(
        frame, ["*within=4/s", "/tiles/*=20/s"], ["log"], server_time=BENCH
    )
    assert forward.routes[0].also_matched == {"*within": both}
    assert backward.routes[0].also_matched == {"/tiles/*": both}
    assert forward.routes[0].requests - both == backward.routes[1].requests
    assert backward.routes[0].requests - both == forward.routes[1].requests
    assert f"{both:,} requests matched both '/tiles/*' and '*within'" in forward.table()


def test_chunks_and_one_frame_give_the_same_route_plan():
    frame = demo_trace(4)
    whole = routes.plan_routes_trace(frame, DEMO_ROUTES, ALGOS, server_time=BENCH)
    pieces = [frame.iloc[i : i + 700] for i in range(0, len(frame), 700)]
    chunked = routes.plan_routes_trace(pieces, DEMO_ROUTES, ALGOS, server_time=BENCH)
    assert chunked.to_dict() == whole.to_dict()


def test_the_route_plan_as_json_and_as_a_frame():
    frame = demo_trace(5)
    plan = routes.plan_routes_trace(frame, DEMO_ROUTES, ALGOS, server_time=BENCH)
    document = json.loads(json.dumps(plan.to_dict()))
    assert [r["name"] for r in document["routes"]] == ["tiles", "geofence"]
    assert sum(r["requests"] for r in document["routes"]) + document["unplanned"][
        "requests"
    ] == len(frame)
    geofence = document["routes"][1]
    assert geofence["cost"] == "ratelimit.costs:geofence_cost(radius)"
    assert geofence["candidates"] == candidates(plan.routes[1].plan)
    unplanned = frame["path"].str.split("?").str[0]
    unplanned = unplanned[~unplanned.str.startswith("/tiles/") & (unplanned != "/within")]
    top = {t["path"]: t["requests"] for t in document["unplanned"]["top"]}
    assert top == {"/healthz": int((unplanned == "/healthz").sum()),
                   "(no path)": int((unplanned == "").sum())}  # fmt: skip

    table = plan.frame()
    assert len(table) == 2 * len(ALGOS) + 1  # a row per route and algorithm, + unplanned
    for r in plan.routes:
        rows = table[table["route"] == r.route.name].set_index("algorithm")
        for c in r.plan.candidates:
            assert rows.loc[c.algorithm, "rejected"] == c.rejected
            assert rows.loc[c.algorithm, "keys"] == c.redis.keys
    assert table.iloc[-1]["route_requests"] == plan.unplanned
    assert "(unplanned)" in plan.table() and "geofence" in plan.table()


def test_routes_need_paths_and_distinct_names():
    frame = demo_trace(6).drop(columns="path")
    with pytest.raises(ValueError, match="no 'path' column"):
        routes.plan_routes_trace(frame, ["/tiles/*=1/s"], ["log"], server_time=BENCH)
    with pytest.raises(ValueError, match="two routes are named 'a'"):
        routes.plan_routes_trace(
            demo_trace(6), ["/x=1/s,name=a", "/y=1/s,name=a"], ["log"], server_time=BENCH
        )
    with pytest.raises(ValueError, match="at least one route"):
        routes.plan_routes_trace(demo_trace(6), [], ["log"], server_time=BENCH)


# --- filters ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "condition",
    ["status=2xx", "status=404,503", "status!=5xx", "status=200,4xx", "method=get",
     "method!=GET", "path=/tiles/*", "path!=/healthz,/tiles/*", "path=/within"],
)  # fmt: skip
def test_a_filter_keeps_what_a_row_by_row_reading_keeps(condition):
    frame = demo_trace(7, n=800)
    expected = np.array([keeps(condition, row) for _, row in frame.iterrows()])
    mask = routes.parse_where(condition).mask(frame)
    assert (mask == expected).all()
    assert 0 < expected.sum() < len(frame)
    parsed = routes.parse_where(condition)
    row_wise = [parsed.holds(row.to_dict()) for _, row in frame.iterrows()]
    assert row_wise == list(expected)


def test_a_filtered_plan_is_the_plan_of_the_requests_it_keeps():
    frame = demo_trace(8)
    where = ["status=2xx,3xx", "path!=/healthz"]
    plan = routes.plan_where_trace(frame, ["5/s", "60/min"], ALGOS, where=where,
                                   server_time=BENCH)  # fmt: skip
    kept = frame[[all(keeps(w, row) for w in where) for _, row in frame.iterrows()]]
    expected = planner.plan_trace(kept, ["5/s", "60/min"], ALGOS, server_time=BENCH)
    assert candidates(plan) == candidates(expected)
    document = plan.to_dict()
    assert document["log"]["where"] == {"conditions": where, "requests_read": len(frame),
                                        "kept": len(kept)}  # fmt: skip
    assert document["log"]["requests"] == len(kept)
    assert f"kept {len(kept):,} of {len(frame):,} requests read" in plan.table()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("status", "FIELD=VALUES"),
        ("agent=curl", "the fields are status, method, path"),
        ("status=2xy", "not a status"),
        ("status=600", "not a status"),
        ("method=", "names no value"),
    ],
)
def test_a_bad_filter_is_one_line(text, words):
    with pytest.raises(ValueError, match=words) as caught:
        routes.parse_where(text)
    assert "\n" not in str(caught.value)


# --- routes and costs as written --------------------------------------------------------


def test_a_route_is_read_with_its_options():
    route = routes.parse_route("/within=10/s, cost=ratelimit.costs:geofence_cost(radius) "
                               "name=geofence")  # fmt: skip
    assert (route.pattern, route.limit, route.window_s, route.name) == ("/within", 10, 1.0,
                                                                         "geofence")  # fmt: skip
    assert route.cost_text == "ratelimit.costs:geofence_cost(radius)"
    plain = routes.parse_route("/a=b/*=1,000/min")  # "=" in a pattern, "," in a rate
    assert (plain.pattern, plain.limit, plain.window_s, plain.name) == ("/a=b/*", 1000, 60.0,
                                                                         "/a=b/*")  # fmt: skip
    assert plain.cost is None


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("/tiles/*", "write PATTERN=RATE"),
        ("=10/s", "write PATTERN=RATE"),
        ("/tiles/*=10/parsec", "cannot read the rate"),
        ("/x=1/s,name=a,name=b", "name= given twice"),
        ("/x=1/s,name=", "name= is empty"),
        ("/x=1/s,cost=nosuchmodule_xyz:f", "cannot import nosuchmodule_xyz"),
    ],
)
def test_a_bad_route_is_one_line(text, words):
    with pytest.raises(ValueError, match=words) as caught:
        routes.parse_route(text)
    assert "\n" not in str(caught.value)


def test_a_cost_with_a_colon_is_a_function_and_any_other_a_field():
    assert routes.parse_cost("bytes") == "bytes"
    assert routes.parse_cost("headers.x-cost") == "headers.x-cost"
    by_radius = routes.parse_cost("ratelimit.costs:geofence_cost(radius)")
    for radius in (0, 499, 501, 1000, 1499.5, 9000):
        assert by_radius({"path": f"/within?lat=1&radius={radius}"}) == geofence_cost(radius)
    # A field of that name wins over the query parameter (jsonl and csv logs).
    assert by_radius({"radius": "1200", "path": "/within?radius=100"}) == geofence_cost(1200)
    assert by_radius({"request": "GET /within?radius=800 HTTP/1.1"}) == geofence_cost(800)
    with pytest.raises(KeyError):  # the reader counts it as a bad cost
        by_radius({"path": "/within?lat=1"})
    with pytest.raises(ValueError):
        by_radius({"path": "/within?radius=-5"})
    whole = routes.parse_cost("ratelimit.lab.samplelog:example_cost")
    assert whole({"path": "/v1/geofence/within?radius_m=1000"}) == geofence_cost(1000)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("ratelimit.costs:no_such_cost", "ratelimit.costs has no 'no_such_cost'"),
        ("ratelimit.costs:GEOFENCE_MAX_COST", "is not callable"),
        ("no_such_module_xyz:f(radius)", "cannot import no_such_module_xyz"),
        ("ratelimit.costs:geofence_cost()", "name the field or query parameter"),
        ("ratelimit.costs:geofence_cost(a)(b)", "a cost function is MODULE:FUNCTION"),
    ],
)
def test_a_cost_function_that_cannot_be_found_is_one_line(text, words):
    with pytest.raises(ValueError, match=words) as caught:
        routes.parse_cost(text)
    assert "\n" not in str(caught.value)


def test_each_line_is_priced_by_its_own_route():
    specs = [routes.parse_route(s) for s in DEMO_ROUTES]
    price = routes._dispatch(specs, "bytes", [routes.parse_where("status!=5xx")])
    tile = {"path": "/tiles/1/2/3.png", "bytes": "7", "status": "200"}
    assert price(tile) == "7"  # the field's text: the reader reads it as an integer
    geo = {"path": "/within?radius=1400", "bytes": "7", "status": "200"}
    assert price(geo) == geofence_cost(1400)
    assert price({"path": "/healthz", "bytes": "-", "status": "200"}) == 1  # unplanned
    assert price({"path": "/within", "status": "503"}) == 1  # filtered out: never priced
    with pytest.raises(KeyError):
        price({"path": "/within", "status": "200"})  # a geofence look-up without radius
    # Without a route's own cost, the default prices every line as the reader would.
    assert routes._dispatch([routes.parse_route("/a=1/s")], "bytes", []) == "bytes"


# --- a written log, end to end ----------------------------------------------------------


def write_clf(frame: pd.DataFrame, path: Path) -> Path:
    """`frame` as a Common Log Format log with millisecond times: the identity in the
    user field, a request "-" for a line without a path. (A status "-" makes a line
    malformed to the reader: give none.)"""
    assert (frame["status"] != "").all()
    import datetime

    lines = []
    for row in frame.itertuples(index=False):
        ms = round((row.time - T0) * 1000) + int(T0) * 1000
        moment = datetime.datetime.fromtimestamp(ms // 1000, tz=datetime.UTC)
        stamp = moment.strftime("%d/%b/%Y:%H:%M:%S") + f".{ms % 1000:03d} +0000"
        request = f"{row.method} {row.path} HTTP/1.1" if row.path else "-"
        lines.append(f'192.0.2.7 - {row.identity} [{stamp}] "{request}" {row.status} 512')
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_plan_command_plans_routes_of_a_written_log(tmp_path, capsys):
    from ratelimit.lab.__main__ import main

    frame = demo_trace(9)
    frame = frame[frame["status"] != ""].reset_index(drop=True)
    log = write_clf(frame, tmp_path / "demo.log")
    out = tmp_path / "routes.json"
    where = ["status!=5xx"]
    argv = ["plan", str(log), "--identity", "user", "--no-measure", "--no-progress",
            "--json", str(out), "--where", where[0]]  # fmt: skip
    for spec in DEMO_ROUTES:
        argv += ["--route", spec]
    assert main(argv) == 0
    printed = capsys.readouterr()
    assert "Per-route plan for" in printed.out and "(unplanned)" in printed.out
    document = json.loads(out.read_text())

    # By hand: the frame's own costs (geofence_cost of each radius), filtered and routed
    # row by row.
    patterns = ["/tiles/*", "/within"]
    kept = frame[[all(keeps(w, row) for w in where) for _, row in frame.iterrows()]]
    routed = np.array([route_by_hand(p, patterns) for p in kept["path"]])
    assert document["where"] == {"conditions": where, "requests_read": len(frame),
                                 "kept": len(kept)}  # fmt: skip
    assert document["unplanned"]["requests"] == int(np.count_nonzero(routed < 0))
    for i, (route, limit) in enumerate(zip(document["routes"], [(20, 1.0), (10, 1.0)],
                                           strict=True)):  # fmt: skip
        alone = kept[routed == i]
        expected = planner.plan_trace(alone, [limit], server_time=BENCH)
        assert route["requests"] == len(alone)
        assert route["candidates"] == candidates(expected)
    assert document["routes"][1]["cost"] == "ratelimit.costs:geofence_cost(radius)"


def test_the_plan_command_filters_and_prices_by_a_cost_function(tmp_path, capsys):
    from ratelimit.lab.__main__ import main

    frame = demo_trace(10)
    frame = frame[frame["path"].str.startswith("/within") & (frame["status"] != "")]
    frame = frame.reset_index(drop=True)
    log = write_clf(frame, tmp_path / "geo.log")
    out = tmp_path / "plan.json"
    argv = ["plan", str(log), "--identity", "user", "--no-measure", "--no-progress",
            "--limit", "4/s", "--cost", "ratelimit.costs:geofence_cost(radius)",
            "--where", "method=GET", "--where", "status=2xx,3xx", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    where = ["method=GET", "status=2xx,3xx"]
    kept = frame[[all(keeps(w, row) for w in where) for _, row in frame.iterrows()]]
    expected = planner.plan_trace(kept, ["4/s"], server_time=BENCH)
    document = json.loads(out.read_text())
    assert document["candidates"] == candidates(expected)
    assert document["log"]["cost"] == "ratelimit.costs:geofence_cost(radius)"
    assert document["log"]["where"]["kept"] == len(kept)
    assert f"kept {len(kept):,} of {len(frame):,}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (["--route", "/tiles/*"], "write PATTERN=RATE"),
        (["--route", "/tiles/*=1/s", "--limit", "5/s"], "give --limit or --route, not both"),
        (["--cost", "ratelimit.costs:nope"], "ratelimit.costs has no 'nope'"),
        (["--where", "agent=curl"], "the fields are status, method, path"),
    ],
)
def test_bad_route_filter_and_cost_options_exit_2_with_one_line(tmp_path, capsys, options, words):
    from ratelimit.lab.__main__ import main

    frame = demo_trace(11, n=40)
    log = write_clf(frame[frame["status"] != ""], tmp_path / "small.log")
    with pytest.raises(SystemExit) as stopped:
        main(["plan", str(log), "--no-measure", *options])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # after the usage, the message: one line
    assert last.startswith("python -m ratelimit.lab plan: error: ") and words in last
    assert "Traceback" not in err
