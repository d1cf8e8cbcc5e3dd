"""Chapter 2's module: the setup's traces and replays, the classic key-per-window fixed
window, the sweep over the clock skew, its tables and README texts, and figures that
draw exactly the sweep's numbers; the sliders redraw the Explore one."""

from __future__ import annotations

import functools
import inspect
import string
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from ratelimit.lab import records  # noqa: E402
from ratelimit.lab.chapters import clock_skew  # noqa: E402
from ratelimit.lab.plotting import explorer  # noqa: E402

# Short traces keep the tests quick; the shape of the story is the same.
QUICK = {"duration_s": 20.0, "skew_step_ms": 250}
SETUP = clock_skew.Setup(**QUICK)
CLASSIC = clock_skew.CLASSIC_LABEL.format(ttl=SETUP.classic_ttl_windows)


@pytest.fixture(scope="module")
def swept():
    return clock_skew.sweep(SETUP)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _lines(fig: Figure) -> dict:
    return {line.get_label(): line.get_data() for line in fig.axes[0].get_lines()}


def test_setup_defaults_are_the_chapters_and_bad_steps_are_refused():
    setup = clock_skew.Setup()
    chapter = (setup.limit, setup.window_ms, setup.replicas, setup.rate, setup.seed)
    assert chapter == (10, 1000, 3, 30.0, 7)
    # The sweep starts with the small skews NTP keeps clocks in, then steps by 50 ms.
    assert setup.skews_ms[:4] == [0, 1, 2, 5] and 20 in setup.skews_ms
    small = [s for s in setup.skews_ms if s < setup.skew_step_ms]
    assert small == [0, *setup.small_skews_ms]
    assert setup.skews_ms[len(small) :] == list(range(50, 2001, 50))
    assert setup.apart_ms == 1000 and clock_skew.Setup(replicas=5).apart_ms == 2000
    assert setup.classic_ttl_windows == 10
    for bad in (
        {"skew_step_ms": 0},
        {"max_skew_ms": -1},
        {"small_skews_ms": (-1,)},
        {"small_skews_ms": (1.5,)},
        {"classic_ttl_windows": 0},
    ):
        with pytest.raises(ValueError):
            clock_skew.Setup(**bad)
    with pytest.raises(ValueError):
        SETUP.limiter("nope")


def test_skews_merge_the_small_ones_and_stop_at_the_largest():
    setup = clock_skew.Setup(max_skew_ms=100, skew_step_ms=50, small_skews_ms=(50, 7, 200))
    assert setup.skews_ms == [0, 7, 50, 100]  # sorted, once each, none beyond the largest
    assert clock_skew.Setup(max_skew_ms=0).skews_ms == [0]


def test_only_the_clocks_move_with_the_skew():
    base, skewed = SETUP.trace(0), SETUP.trace(300)
    assert (base.clock_offset == 0).all()
    assert base.time.equals(skewed.time) and base.replica.equals(skewed.replica)
    assert clock_skew.clock_table(SETUP, 300).offset_ms.tolist() == [-300, 0, 300]
    table = clock_skew.stamped(skewed.head(3))
    offsets = (table["stamped ms (app clock)"] - table["true ms"]).tolist()
    assert offsets == [-300, 0, 300]


def test_the_limiters_clock_options():
    assert SETUP.limiter().clock != "redis" and SETUP.limiter(clock="redis").clock == "redis"
    assert type(SETUP.limiter("fw")).__name__ == "FixedWindowLimiter"
    app, one_clock = SETUP.replay(300), SETUP.replay(300, clock="redis")
    assert SETUP.peak(app) > SETUP.limit == SETUP.peak(one_clock)
    assert (SETUP.errors(one_clock) == 0).all() and (SETUP.errors(app) != 0).any()


def test_by_replica_sums_to_the_replay():
    table = clock_skew.by_replica(SETUP, 300)
    app = SETUP.replay(300)
    assert table.index.tolist() == [0, 1, 2]
    assert table.requests.sum() == len(app) and table.admitted.sum() == app.allowed.sum()
    assert (table.admitted + table.rejected == table.requests).all()
    assert (table["most early"] <= table["mean error"]).all()
    assert (table["mean error"] <= table["most late"]).all()


def test_header_seconds_round_up_to_at_least_one():
    assert clock_skew.header_seconds([0, 1, 999, 1000, 1001]).tolist() == [1, 1, 1, 1, 2]


def _trace(rows: list[tuple[float, float]], identity: str = "c") -> pd.DataFrame:
    """A hand-made trace: (true time s, clock offset s) per request, cost 1."""
    return pd.DataFrame(
        {
            "time": [t for t, _ in rows],
            "identity": identity,
            "cost": 1,
            "replica": 0,
            "clock_offset": [o for _, o in rows],
        }
    )


def test_classic_fixed_window_counts_per_window_of_the_replicas_clock():
    # Three in window 0, then two stamped in window 1 by a clock 0.5 s ahead, then one
    # stamped back in window 0 by a true clock: it counts in window 0's key again.
    trace = _trace([(0.1, 0), (0.2, 0), (0.3, 0), (0.6, 0.5), (0.7, 0.5), (0.8, 0)])
    out = clock_skew.classic_fixed_window(trace, 1000, 3, 10_000)
    assert out.allowed.tolist() == [True, True, True, True, True, False]
    assert out.drop(columns="allowed").equals(trace)  # the trace itself is left as it was
    # Costs count in full: two requests of cost 2 do not fit a limit of 3.
    heavy = trace.head(2).assign(cost=2)
    assert clock_skew.classic_fixed_window(heavy, 1000, 3, 10_000).allowed.tolist() == [
        True,
        False,
    ]
    with pytest.raises(ValueError):
        clock_skew.classic_fixed_window(trace, 1000, 3, 0)


def test_classic_keys_expire_on_the_true_clock():
    # A clock 2 s behind reaches window 0 after its key, made at true 0.1 s, has expired
    # (a TTL of one window): the count starts again. With a longer TTL it does not.
    rows = [(0.1, 0), (0.2, 0), (2.1, -2.0), (2.2, -2.0)]
    short = clock_skew.classic_fixed_window(_trace(rows), 1000, 2, 1000).allowed
    long = clock_skew.classic_fixed_window(_trace(rows), 1000, 2, 5000).allowed
    assert short.tolist() == [True, True, True, True]
    assert long.tolist() == [True, True, False, False]
    # Keys are per client: another identity has a budget of its own.
    both = pd.concat([_trace(rows[:2]), _trace(rows[:2], identity="d")], ignore_index=True)
    assert clock_skew.classic_fixed_window(both, 1000, 2, 1000).allowed.all()


def test_without_skew_the_classic_is_our_fixed_window():
    ours, classic = SETUP.replay(0, tag="fw"), SETUP.replay_classic(0)
    assert classic.allowed.equals(ours.allowed)
    assert SETUP.replay_classic(300, ttl_windows=10).allowed.equals(
        SETUP.replay_classic(300).allowed
    )


def test_the_sweep_tells_the_chapters_story(swept):
    table, decisions = swept
    assert table.index.tolist() == SETUP.skews_ms == sorted(decisions["app"])
    app = table["app peak"]
    assert app[0] == 10 and (app.iloc[1:] > 10).all()
    # Within NTP's range the overshoot is smaller than at large skews.
    assert app[app.index <= 20].iloc[1:].max() < app.max() < 3 * 10
    assert (table["Redis peak"] == 10).all() and (table["Redis largest |error| (ms)"] == 0).all()
    ratio = table["app mean |error| / S"]
    assert np.isnan(ratio[0]) and (ratio[(ratio.index > 0) & (ratio.index <= 20)] < 1).all()
    # Both fixed windows keep limiting under skew; ours stays about at the boundary
    # burst, the classic's peak climbs past one limit per replica.
    fixed, classic = table["fixed peak"], table["classic peak"]
    assert fixed[0] == classic[0] > 10 and fixed.max() <= 2.5 * 10 < classic.max()
    for rejected in (table["fixed rejected"], table["classic rejected"]):
        assert (abs(rejected - rejected[0]) <= 0.15 * rejected[0]).all()
    assert (fixed > app).all() and (table["fixed rejected"] < table["app rejected"]).all()
    # The Redis clock at every skew decides as the app clock without skew.
    assert all(d.equals(decisions["app"][0]) for d in decisions["redis"].values())
    assert not decisions["app"][250].equals(decisions["app"][0])


def test_regimes_read_the_curve_off_the_table():
    table = pd.DataFrame(
        {
            "app peak": [10, 11, 11, 12, 12],
            "app mean |error| / S": [np.nan, 0.9, 0.8, 1.0, 1.1],
            "app most too late (ms)": [0, 2, 8, 20, 80],
        },
        index=pd.Index([0, 1, 4, 10, 40], name="S (ms)"),
    )
    curve = clock_skew.regimes(table, 4)
    assert curve["small_skew_from_ms"] == 1 and curve["small_skew_to_ms"] == 4
    assert curve["peak_small_min"] == curve["peak_small_max"] == 11
    assert curve["ratio_small_min"] == 0.8 and curve["ratio_small_max"] == 0.9
    assert curve["peak_large"] == 12 and curve["large_skew_from_ms"] == 10
    assert curve["peak_first_level"] == 11 and curve["first_level_to_ms"] == 4
    assert curve["ratio_min"] == 0.8 and curve["ratio_max"] == 1.1
    assert curve["most_late_per_s"] == 2.0
    with pytest.raises(ValueError):
        clock_skew.regimes(table, 5)  # not a skew of the table


def test_the_wider_sweep_varies_replicas_rates_and_seeds_only():
    quick = clock_skew.Setup(duration_s=10.0, max_skew_ms=500, skew_step_ms=250)
    peaks = clock_skew.generality(quick, (2, 4), (20.0,), (1, 2))
    assert len(peaks) == 2 * 2 * len(quick.skews_ms)
    one = peaks[(peaks.replicas == 4) & (peaks.seed == 2)].set_index("S (ms)").peak
    again = clock_skew.Setup(duration_s=10.0, max_skew_ms=500, skew_step_ms=250, replicas=4,
                             rate=20.0, seed=2)  # fmt: skip
    assert one.tolist() == [again.peak(again.replay(s)) for s in again.skews_ms]
    table = clock_skew.generality_table(peaks, quick.limit, 20, (1, 500))
    assert table.columns.tolist() == [
        "S = 1 ms",
        "S = 500 ms",
        "fewest, 0 < S <= 20 ms",
        "most, S <= 20 ms",
        "most, any S",
        "limit + N - 1",
    ]
    assert table["limit + N - 1"].tolist() == [11, 13]
    skewed = peaks[peaks["S (ms)"] > 0]
    assert table["most, any S"].tolist() == skewed.groupby("replicas").peak.max().tolist()
    quoted = clock_skew.generality_records(peaks, table, 20)
    assert quoted["grid_replays"] == (len(peaks), ",d") and quoted["grid_seeds"][0] == 2
    assert (quoted["grid_replicas_min"][0], quoted["grid_replicas_max"][0]) == (2, 4)


def test_expiry_table_replays_the_classic_per_ttl(swept):
    table = clock_skew.expiry_table(SETUP, [0, 2000], ttl_windows=(1, 10))
    assert table.columns.tolist() == [
        "W + 2S (ms)",
        "rejected, TTL 1000 ms",
        "rejected, TTL 10000 ms",
    ]
    assert table["W + 2S (ms)"].tolist() == [1000, 5000]
    assert (
        table["rejected, TTL 10000 ms"].tolist()
        == swept[0].loc[[0, 2000], "classic rejected"].tolist()
    )
    short = table["rejected, TTL 1000 ms"]
    assert short[0] == table.loc[0, "rejected, TTL 10000 ms"]  # no skew: the TTL is enough
    assert short[2000] < 0.25 * short[0]  # a key gone before the replica behind comes


def test_readme_texts_quote_only_record_names():
    for template in (clock_skew.SUMMARY, clock_skew.HEADLINE):
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f]
        assert fields and all(f.isidentifier() and f == f.lower() for f in fields)
        assert "[-S, +S]" in template and "2S apart" in template  # one definition of S
    assert clock_skew.TITLE == "Clock skew"


def test_readme_texts_render_from_the_committed_records():
    directory = Path(__file__).resolve().parents[2] / records.NOTEBOOKS_DIR / records.RECORDS_DIR
    values = records.load("02_clock_skew", directory)["values"]
    for template in (clock_skew.SUMMARY, clock_skew.HEADLINE):
        text = records.fill(template, values, "clock_skew")
        assert "{" not in text and values["peak_redis"]["text"] in text


def test_settled_from_finds_the_last_change():
    same = {s: pd.DataFrame({"allowed": [True, False]}) for s in (0, 50, 100)}
    assert clock_skew.settled_from(same) == 0
    same[0] = pd.DataFrame({"allowed": [True, True]})
    assert clock_skew.settled_from(same) == 50
    same[50] = same[0]
    assert clock_skew.settled_from(same) == 100


def test_error_table_renames_the_error_columns(swept):
    table = clock_skew.error_table(swept[0])
    assert table.columns.tolist() == list(clock_skew.ERROR_COLUMNS.values())
    assert table["most late"].tolist() == swept[0]["app most too late (ms)"].tolist()


def test_section_figures_draw_the_sweep(swept):
    table = swept[0]
    fig = clock_skew.peaks_figure(SETUP, table)
    lines = _lines(fig)
    assert lines[clock_skew.APP_LABEL][0].tolist() == SETUP.skews_ms
    for label, column in [
        (clock_skew.APP_LABEL, "app peak"),
        (clock_skew.REDIS_LABEL, "Redis peak"),
        (clock_skew.FIXED_LABEL, "fixed peak"),
        (CLASSIC, "classic peak"),
    ]:
        assert lines[label][1].tolist() == table[column].tolist()
    ax = fig.axes[0]
    # One definition of S on the axis; the small skews get room of their own.
    assert "[-S, +S]" in ax.get_xlabel() and "2S apart" in ax.get_xlabel()
    assert ax.get_xscale() == "symlog"
    assert [0, 1, 2, 5, 10, 20] == [int(t) for t in ax.get_xticks()[:6]]

    fig = clock_skew.errors_figure(SETUP, table)
    left, right = fig.axes
    lines = {line.get_label(): line.get_data() for line in left.get_lines()}
    assert lines["app clock: mean |error|"][1].tolist() == table["app mean |error| (ms)"].tolist()
    per_ms = {line.get_label(): line.get_data() for line in right.get_lines()}
    skewed = table[table.index > 0]
    assert per_ms["mean |error| / S"][0].tolist() == skewed.index.tolist()
    assert per_ms["mean |error| / S"][1].tolist() == skewed["app mean |error| / S"].tolist()
    assert "[-S, +S]" in left.get_xlabel() and right.get_xscale() == "symlog"

    fig = clock_skew.error_histogram(SETUP, 300)
    counts = sum(patch.get_height() for patch in fig.axes[0].patches)
    assert counts == len(SETUP.errors(SETUP.replay(300)))  # every rejection, once
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == [
        "replica 0 (clock -300 ms)",
        "replica 1 (clock +0 ms)",
        "replica 2 (clock +300 ms)",
    ]


def test_explore_figure_is_the_section_figure_of_a_fresh_sweep(swept):
    fig = clock_skew.figure(**QUICK)
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    assert ax.get_title() and "ms" in ax.get_xlabel() and "requests" in ax.get_ylabel()
    assert ax.get_legend() is not None
    shown = _lines(fig)
    drawn = _lines(clock_skew.peaks_figure(SETUP, swept[0]))
    for label in (clock_skew.APP_LABEL, clock_skew.REDIS_LABEL, clock_skew.FIXED_LABEL, CLASSIC):
        assert np.array_equal(shown[label][1], drawn[label][1])


def test_parameters_change_the_plotted_data():
    base = _lines(clock_skew.figure(**QUICK))
    more = _lines(clock_skew.figure(replicas=5, **QUICK))
    assert (more[clock_skew.APP_LABEL][1] != base[clock_skew.APP_LABEL][1]).any()
    assert 10 < more[clock_skew.APP_LABEL][1].max() < 5 * 10
    lower = _lines(clock_skew.figure(limit=4, **QUICK))
    assert (lower[clock_skew.REDIS_LABEL][1] == 4).all()
    narrow = _lines(clock_skew.figure(max_skew_ms=500, small_skews_ms=(10,), **QUICK))
    assert narrow[clock_skew.APP_LABEL][0].tolist() == [0, 10, 250, 500]
    shorter = _lines(clock_skew.figure(classic_ttl_windows=1, **QUICK))
    assert shorter[clock_skew.CLASSIC_LABEL.format(ttl=1)][1].max() > base[CLASSIC][1].max()


@pytest.mark.parametrize("change", [{"replicas": 1}, {"max_skew_ms": 0}])
def test_edge_cases_draw(change):
    skews, app = _lines(clock_skew.figure(**change, **QUICK))[clock_skew.APP_LABEL]
    assert (app == 10).all()  # one replica, or no skew: exact
    assert len(skews) == (1 if change.get("max_skew_ms") == 0 else len(SETUP.skews_ms))


def test_sliders_start_at_the_defaults_and_redraw():
    calls = []

    def draw(**values):
        calls.append(values)
        return clock_skew.figure(**values, **QUICK)

    # explorer reads the defaults from the function it is given: use the real one's.
    draw.__signature__ = inspect.signature(clock_skew.figure)
    widget = explorer(draw, **clock_skew.SLIDERS)
    assert len(calls) == 1
    assert calls[0] == {"replicas": 3, "max_skew_ms": 2000, "rate": 30.0, "limit": 10}
    widget.children[0].value = 5  # replicas
    assert len(calls) == 2 and calls[-1]["replicas"] == 5
    assert [c.description for c in widget.children[:4]] == list(clock_skew.SLIDERS)


def test_sliders_start_at_the_parameters_the_chapter_passes():
    draw = functools.partial(clock_skew.figure, replicas=4, limit=7, **QUICK)
    widget = explorer(draw, **clock_skew.SLIDERS)
    values = {c.description: c.value for c in widget.children[:4]}
    assert values == {"replicas": 4, "max_skew_ms": 2000, "rate": 30.0, "limit": 7}
    widget.children[1].value = 250  # redraws without error
    assert widget.children[1].value == 250
