"""Chapter 7's module: the demo app's answers, the client loop over HTTP and on the model,
the outage table, the real server, and the figures drawn from what they computed."""

from __future__ import annotations

import json
import logging
import math

import httpx
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from ratelimit.costs import geofence_cost  # noqa: E402
from ratelimit.devtools.process import pid_alive  # noqa: E402
from ratelimit.lab import logs  # noqa: E402
from ratelimit.lab.chapters import http_route  # noqa: E402
from ratelimit.lab.plotting import explorer  # noqa: E402

KEY = "test-key"


def plotted(fig: Figure) -> list[np.ndarray]:
    """Every line's y data and every bar's height, axes by axes."""
    data = []
    for ax in fig.axes:
        data += [np.asarray(line.get_ydata(), dtype=float) for line in ax.lines]
        data += [np.array([bar.get_height() for bar in c]) for c in ax.containers]
    return data


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def response(status: int, headers: dict[str, str], body: dict | None = None) -> httpx.Response:
    request = httpx.Request("GET", "http://demo/within")
    return httpx.Response(status, headers=headers, json=body or {}, request=request)


# --- the app in this process ------------------------------------------------------------


def test_parse_item_reads_name_and_integer_parameters():
    assert http_route.parse_item('"geofence";r=9;t=1') == {"name": "geofence", "r": 9, "t": 1}
    assert http_route.parse_item('"tiles";q=100;w=2') == {"name": "tiles", "q": 100, "w": 2}
    with pytest.raises(ValueError):
        http_route.parse_item('"geofence";r=nine')


async def test_look_ups_over_the_limit_are_refused_and_the_key_stays_bounded():
    app = http_route.demo_app(limit=3)
    responses = await http_route.look_ups(app, KEY, 5)
    table = http_route.verification_table(responses)
    assert table.index.tolist() == [1, 2, 3, 4, 5] and table.index.name == "request"
    assert table.status.tolist() == [200, 200, 200, 429, 429]
    # The sliding log's 200s carry no t: its answer does not say when a unit comes back.
    assert table["RateLimit"].tolist()[:3] == [f'"geofence";r={r}' for r in (2, 1, 0)]
    assert table["RateLimit"].tolist()[3:] == ['"geofence";r=0;t=1'] * 2
    assert table["Retry-After"].tolist() == ["", "", "", "1", "1"]
    key, members, ttl_ms = await http_route.key_state(app, KEY)
    assert key == f"rl:geofence:key:{KEY}" and members == 3 and 0 < ttl_ms <= 1000
    check = await http_route.seed_check(app, KEY)
    assert check["key"] == check["typed"] == check["python"] == check["app"] == key
    assert check["key"] != check["bare"]
    assert check["command"] == (
        f"python -m ratelimit key {KEY} --scope geofence --window-ms 1000 --plain-keys"
    )
    assert (check["ZCARD"], 0 < check["PTTL"] <= 1000) == (members, True)


async def test_seed_check_on_a_key_nobody_used_finds_nothing():
    check = await http_route.seed_check(http_route.demo_app(), "never-sent")
    assert (check["ZCARD"], check["PTTL"]) == (0, -2)  # -2: no such key
    with pytest.raises(SystemExit):
        http_route.key_from_the_command_line(["key"])  # neither API key nor address


def test_headers_table_has_one_column_per_response_and_the_meanings():
    ok = response(200, {"RateLimit": '"geofence";r=9;t=1', "RateLimit-Policy": "p"})
    refused = response(429, {"RateLimit": '"geofence";r=0;t=1', "Retry-After": "1"})
    table = http_route.headers_table({"ok": ok, "refused": refused})
    assert table.columns.tolist() == ["ok", "refused", "meaning"]
    assert table.index.tolist() == list(http_route.HEADER_MEANINGS)
    assert table.loc["Retry-After", "ok"] == "" and table.loc["Retry-After", "refused"] == "1"
    assert table.loc["RateLimit-Policy", "ok"] == "p"
    assert table.loc["Content-Type", "ok"] == "application/json"


def test_as_sent_leaves_out_the_fields_that_vary():
    r = response(429, {"Retry-After": "1", "date": "Mon", "server": "uvicorn"}, {"status": 429})
    text = http_route.as_sent(r)
    lines = text.splitlines()
    assert lines[0] == "HTTP/1.1 429 Too Many Requests"
    assert "retry-after: 1" in [line.lower() for line in lines]
    assert not any(
        line.lower().startswith(("date:", "server:", "content-length:")) for line in lines
    )
    assert json.loads(text.split("\n\n", 1)[1]) == {"status": 429}


# --- cost-weighted look-ups -------------------------------------------------------------


@pytest.mark.parametrize("max_cost", [3, 10])
def test_cost_thresholds_are_where_geofence_cost_steps_up(max_cost):
    table = http_route.cost_thresholds(max_cost)
    assert table.index.tolist() == list(range(2, max_cost + 1))
    for cost, above_m in table["from above (m)"].items():
        assert geofence_cost(above_m - 0.5, max_cost) < cost <= geofence_cost(above_m + 0.5)
        assert above_m == round(500 * math.sqrt(cost - 1))  # the area rule, ceil((r/500)^2)


def test_cost_table_caps_at_the_limit():
    table = http_route.cost_table([100, 1000, 5000], limit=6, window_s=2)
    assert table.index.name == "radius (m)"
    assert table["cost (units)"].tolist() == [1, 4, 6]  # 5 km would cost 10: capped at 6
    assert table["look-ups per 2 s"].tolist() == [6, 1, 1]


async def test_cost_sequence_refuses_what_costs_more_than_is_left():
    sequence = await http_route.cost_sequence([1000, 1000, 1000, 100], 100, limit=10)
    assert sequence["time (ms)"].tolist() == [0, 100, 200, 300]
    assert sequence.cost.tolist() == [4, 4, 4, 1]
    assert sequence.status.tolist() == [200, 200, 429, 200]
    assert sequence["r (units left)"].tolist() == [6, 2, 2, 1]
    assert http_route.units_in_window(sequence, 1000) == [4, 8, 8, 9]


def test_units_in_window_forgets_what_left_the_window():
    sequence = pd.DataFrame(
        {"time (ms)": [0, 500, 1000, 1200], "cost": [3, 2, 5, 1], "status": [200, 200, 429, 200]}
    )
    assert http_route.units_in_window(sequence, 1000) == [3, 5, 2, 3]


def test_sequence_figure_shows_the_sequence():
    sequence = pd.DataFrame(
        {"time (ms)": [0, 125, 250], "cost": [4, 9, 1], "status": [200, 429, 200]}
    )
    fig = http_route.sequence_figure(sequence, limit=10, step_ms=125)
    try:
        (ax,) = fig.axes
        admitted, refused = ax.containers
        assert [b.get_height() for b in admitted] == [4, 1]
        assert [b.get_height() for b in refused] == [9]
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    finally:
        plt.close(fig)


# --- clients ----------------------------------------------------------------------------


def drive(loop: http_route.ClientLoop, answers) -> list[int]:
    times = []
    for now_ms, (status, headers) in zip(loop, answers, strict=False):
        times.append(now_ms)
        loop.answer(status, headers)
    return times


POLICY = {"RateLimit-Policy": '"geofence";q=10;w=1'}
REFUSED = {**POLICY, "Retry-After": "2", "Retry-After-Ms": "1500"}


@pytest.mark.parametrize(
    ("client", "gaps", "waited"),
    [
        (http_route.HAMMERS, [20, 70, 20], [False] * 4),
        (http_route.HONOURS_RETRY_AFTER, [20, 2020, 20], [False, False, True, False]),
        (http_route.HONOURS_RETRY_AFTER_MS, [20, 1520, 20], [False, False, True, False]),
        (http_route.PACED, [100, 100, 100], [False] * 4),
    ],
)
def test_client_loop_sends_by_its_behaviour(client, gaps, waited):
    loop = http_route.ClientLoop(client, duration_s=60, latency_ms=20, hammer_retry_ms=50)
    answers = [(200, POLICY), (429, REFUSED), (200, POLICY), (200, POLICY)]
    times = drive(loop, answers)
    assert np.diff(times).tolist() == gaps
    run = loop.run()
    assert run.times_ms.tolist() == times and run.statuses.tolist() == [200, 429, 200, 200]
    assert run.after_retry_after.tolist() == waited
    assert (run.requests, run.admitted_count, run.refused_count) == (4, 3, 1)


def test_client_loop_needs_an_answer_and_a_known_client():
    loop = iter(http_route.ClientLoop(http_route.HAMMERS))
    assert next(loop) == 0
    with pytest.raises(RuntimeError, match="no answer"):
        next(loop)
    with pytest.raises(ValueError, match="client must be one of"):
        http_route.ClientLoop("patient")
    with pytest.raises(ValueError, match="client must be one of"):
        http_route.simulate(client="patient")


def test_client_loop_stops_at_its_duration():
    loop = http_route.ClientLoop(http_route.HAMMERS, duration_s=1, latency_ms=300)
    assert drive(loop, [(200, POLICY)] * 10) == [0, 300, 600, 900]


def test_simulate_tells_the_chapters_story():
    # Section 4 of the chapter, with its parameters: the hammering client gets exactly
    # the limit and more refusals than look-ups; the paced one is never refused.
    hammer = http_route.simulate()
    assert (hammer.requests, hammer.admitted_count, hammer.refused_count) == (215, 100, 115)
    polite = http_route.simulate(client=http_route.HONOURS_RETRY_AFTER)
    assert (polite.admitted_count, polite.refused_count) == (90, 9)
    assert polite.after_retry_after.sum() == 8  # the ninth wait outlasts the run
    assert (polite.statuses[polite.after_retry_after] == 200).all()
    paced = http_route.simulate(client=http_route.PACED)
    assert (paced.admitted_count, paced.refused_count) == (100, 0)
    # Waiting the exact Retry-After-Ms loses nothing: the full rate, one 429 a burst.
    exact = http_route.simulate(client=http_route.HONOURS_RETRY_AFTER_MS)
    full = http_route.LIMIT * http_route.DURATION_S // http_route.WINDOW_S
    assert exact.admitted_count == full == paced.admitted_count == hammer.admitted_count
    bursts = 1 + exact.after_retry_after.sum()
    assert exact.refused_count in (bursts - 1, bursts)  # the run may end inside a burst
    assert (exact.statuses[exact.after_retry_after] == 200).all()


@pytest.mark.parametrize("client", http_route.CLIENTS)
async def test_the_app_over_http_answers_as_the_model(client):
    options = {"limit": 4, "duration_s": 3, "latency_ms": 30, "hammer_retry_ms": 40}
    over_http = await http_route.run_over_http(client=client, **options)
    model = http_route.simulate(client=client, **options)
    assert over_http.times_ms.tolist() == model.times_ms.tolist()
    assert over_http.statuses.tolist() == model.statuses.tolist()
    assert over_http.after_retry_after.tolist() == model.after_retry_after.tolist()


def test_summary_counts_and_rates():
    runs = [http_route.simulate(client=name) for name in http_route.CLIENTS]
    table = http_route.summary(runs, 10)
    assert table.index.tolist() == http_route.CLIENTS and table.index.name == "client"
    assert table.requests.tolist() == [run.requests for run in runs]
    assert table.admitted.tolist() == [run.admitted_count for run in runs]
    assert table.refused.tolist() == [run.refused_count for run in runs]
    assert table["admitted per second"].tolist() == [run.admitted_count / 10 for run in runs]
    rates = [run.refused_count / run.admitted_count for run in runs]
    assert table["refused per admitted"].tolist() == rates


def test_clients_figure_shows_the_runs():
    runs = [http_route.simulate(client=name, duration_s=3) for name in http_route.CLIENTS]
    fig = http_route.clients_figure(runs, duration_s=3)
    try:
        left, right = fig.axes
        steps = [line.get_ydata() for line in left.lines[: len(runs)]]
        assert [len(s) for s in steps] == [run.admitted_count for run in runs]
        admitted, refused = right.containers
        assert [b.get_height() for b in admitted] == [run.admitted_count for run in runs]
        assert [b.get_height() for b in refused] == [run.refused_count for run in runs]
        labels = [t.get_text() for t in right.get_xticklabels()]
        assert labels == [
            "hammers",
            "honours\nRetry-After",
            "honours\nRetry-After-Ms",
            "paced by\nRateLimit-Policy",
        ]
    finally:
        plt.close(fig)


# --- Redis down, and a real server ------------------------------------------------------


async def test_outage_table_fails_open_or_closed_and_logs_each():
    with logs.collected("ratelimit", logging.WARNING) as records:
        table = await http_route.outage_table(KEY, ["allow", "deny"])
    assert table.index.names == ["on_error", "route"]
    assert table.loc["allow", "status"].tolist() == [200, 200]
    assert table.loc["deny", "status"].tolist() == [503, 503]
    assert table.loc["deny", "Retry-After"].tolist() == ["1", "1"]
    assert (table.RateLimit == "(none)").all()
    # One per degraded decision: the look-up let through fail-open has two (its rate's
    # and its lease's); a refused one stops at its rate.
    assert len([r for r in records if r.name == "ratelimit.http"]) == 5


async def test_real_server_refuses_past_its_quota_and_is_stopped():
    server = http_route.start_server()
    try:
        assert server.running
        responses, docs = await http_route.look_ups_over_http(server.url, KEY)
        pid = server.pid
    finally:
        stopped = http_route.stop_server(server)
    statuses = [r.status_code for r in responses]
    assert statuses[-2:] == [429, 429] and set(statuses[:-2]) == {200}
    assert docs.status_code == 200
    assert stopped == {"the uvicorn process is gone": True, "its port is free again": True}
    assert not pid_alive(pid)


# --- Explore ----------------------------------------------------------------------------


def test_default_figure_is_labelled():
    fig = http_route.figure()
    try:
        assert isinstance(fig, Figure)
        assert len(fig.axes) == 2
        for ax in fig.axes:
            assert ax.get_title()
            assert "(s)" in ax.get_xlabel() and ax.get_ylabel()
            assert ax.get_legend() is not None
    finally:
        plt.close(fig)


def test_figure_shows_the_simulated_counts():
    run = http_route.simulate()
    fig = http_route.figure()
    try:
        left, right = fig.axes
        admitted_line, refused_line = left.lines[:2]
        assert admitted_line.get_ydata()[-1] == run.admitted_count
        assert refused_line.get_ydata()[-1] == run.refused_count
        ok, no = right.containers
        assert sum(b.get_height() for b in ok) == run.admitted_count
        assert sum(b.get_height() for b in no) == run.refused_count
    finally:
        plt.close(fig)


@pytest.mark.parametrize(
    "change",
    [{"limit": 20}, {"client": http_route.PACED}, {"duration_s": 5}],
)
def test_a_parameter_changes_the_plotted_data(change):
    default, changed = http_route.figure(), http_route.figure(**change)
    try:
        assert not same(plotted(default), plotted(changed))
    finally:
        plt.close(default)
        plt.close(changed)


def test_sliders_redraw_the_figure(monkeypatch):
    calls = []
    draw = http_route.figure

    def figure(*, limit=10, client=http_route.HAMMERS, duration_s=10):
        calls.append((limit, client, duration_s))
        return draw(limit=limit, client=client, duration_s=duration_s)

    monkeypatch.setattr(plt, "show", lambda *a, **k: None)
    widget = explorer(figure, **http_route.SLIDERS)
    assert calls == [(10, http_route.HAMMERS, 10)]  # drawn once, at the defaults
    assert [c.description for c in widget.children[:3]] == ["limit", "client", "duration_s"]
    widget.children[0].value = 25
    assert calls[-1] == (25, http_route.HAMMERS, 10)
    widget.children[1].value = http_route.PACED
    assert calls[-1] == (25, http_route.PACED, 10)
    plt.close("all")


def test_explorer_starts_at_the_figures_own_defaults():
    widget = explorer(http_route.figure, **http_route.SLIDERS)
    values = [c.value for c in widget.children[:3]]
    assert values == [10, http_route.HAMMERS, 10]
    plt.close("all")


async def test_effective_window_example_says_when_the_first_unit_returns():
    table = await http_route.effective_window_example(
        [0, 0, 3, 3, 3.5, 6, 6, 6], limit=4, window_s=6
    )
    assert table.status.tolist() == [200] * 4 + [429, 200, 200, 429]
    refused = table[table.status == 429]
    # 3.5 s: the look-ups of 0 s leave at 6 s; at 6 s: those of 3 s leave at 9 s.
    assert refused["RateLimit"].tolist() == ['"geofence";r=0;t=3', '"geofence";r=0;t=3']
    assert refused["Retry-After"].tolist() == ["3", "3"]
    assert not table[table.status == 200]["RateLimit"].str.contains("t=").any()


def test_the_readme_texts_quote_only_recorded_numbers():
    from ratelimit.lab import records

    values = records.load("07_http_route", records.NOTEBOOKS_DIR / records.RECORDS_DIR)
    for template in (http_route.SUMMARY, http_route.HEADLINE):
        text = records.fill(template, values["values"], "http_route")
        assert "{" not in text


def test_shown_gives_retry_after_ms_as_its_range_and_anything_else_as_it_is():
    refused = response(429, {"Retry-After": "2", "Retry-After-Ms": "1234"})
    assert http_route.shown("Retry-After-Ms", refused) == "1..2000 (real time)"
    assert http_route.shown("Retry-After", refused) == "2"
    assert http_route.shown("RateLimit", refused) == ""
    wrong = response(429, {"Retry-After": "1", "Retry-After-Ms": "1500"})  # a bug shows
    assert http_route.shown("Retry-After-Ms", wrong) == "1500"
    assert "Retry-After-Ms: 1..2000 (real time)" in http_route.as_sent(refused)


async def test_in_flight_is_rate_times_service_time_and_leases_cap_it():
    """Section 7 on other numbers: 5 a second of 1.5 s each is 7 or 8 in flight (7.5
    on average) under the rate alone; 3 leases cap it at 3, admitting 3 every 1.5 s;
    the figure plots the runs' own counts."""
    params = {"rate_per_s": 5, "service_s": 1.5, "duration_s": 6}
    alone = await http_route.in_flight_run(**params)
    leased = await http_route.in_flight_run(**params, in_flight_limit=3, lease_seconds=10)
    assert alone.admitted == 30 and alone.max_in_flight == 8
    assert alone.curve_in_flight[-1] in (7, 8)
    assert leased.max_in_flight == 3 and leased.admitted == 3 * 4
    refused = leased.statuses == 429
    assert set(leased.refused_by[refused]) == {"in flight"}
    assert (leased.retry_after_ms[refused] <= 10_000).all()
    fig = http_route.in_flight_figure([alone, leased], duration_s=6)
    assert same(plotted(fig), [alone.curve_in_flight, leased.curve_in_flight])
    plt.close(fig)


async def test_tiers_name_the_binding_tier_and_quota_spends_nothing():
    """3 per second and 10 per 10 s: the per-second tier binds until the ten are spent,
    then the 10 s tier refuses with its own wait; a peek (GET /quota) then writes
    nothing, and a reset empties both tiers."""
    run = await http_route.tiers_run(["3/s", "10/10s"], duration_s=4.5)
    req = run.requests
    long = req[(req["status"] == 429) & (req["tier named"] == "geofence-10s")]
    assert (
        len(long) == 1
        and (req[req["time (s)"] < long["time (s)"].iloc[0]]["status"] == 200).sum() == 10
    )
    assert long["t"].iloc[0] == -(-long["Retry-After-Ms"].iloc[0] // 1000)
    table = http_route.tiers_table(run)
    assert table["answers"].sum() == len(req)
    steps = await http_route.quota_and_reset(run)
    entries = steps.filter(like="entries").to_numpy()
    assert steps["status"].tolist() == [200, 200, 429, 200, 200, 200]
    assert (entries[0] == entries[2]).all() and (entries[3] == 0).all() and (entries[5] == 1).all()
    assert (
        json.loads(steps["answer"][1])["retry_after"]
        == http_route.parse_item(steps["answer"][3])["t"]
    )
    http_route.tiers_figure(run)


def test_headline_numbers_are_plain_and_follow_the_summary():
    runs = [http_route.simulate(client=name) for name in http_route.CLIENTS]
    numbers = http_route.headline_numbers(http_route.summary(runs))
    assert numbers["hammer_admitted"][0] == runs[0].admitted_count
    assert all(type(value) in (int, float) for value, _, _ in numbers.values())
    assert numbers["polite_loss_pct"][0] == 1 - runs[1].admitted_count / runs[0].admitted_count
