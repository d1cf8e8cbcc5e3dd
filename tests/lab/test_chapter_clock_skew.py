"""Chapter 2's module: the setup's traces and replays, the sweep over the clock skew, its
tables, and figures that draw exactly the sweep's numbers; the sliders redraw the
Explore one."""

from __future__ import annotations

import functools
import inspect

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from ratelimit.lab.chapters import clock_skew  # noqa: E402
from ratelimit.lab.plotting import explorer  # noqa: E402

# Short traces keep the tests quick; the shape of the story is the same.
QUICK = {"duration_s": 20.0, "skew_step_ms": 250}
SETUP = clock_skew.Setup(**QUICK)


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
    assert setup.skews_ms[:3] == [0, 50, 100] and setup.skews_ms[-1] == 2000
    assert setup.apart_ms == 1000 and clock_skew.Setup(replicas=5).apart_ms == 2000
    with pytest.raises(ValueError):
        clock_skew.Setup(skew_step_ms=0)
    with pytest.raises(ValueError):
        clock_skew.Setup(max_skew_ms=-1)
    with pytest.raises(ValueError):
        SETUP.limiter("nope")


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


def test_the_sweep_tells_the_chapters_story(swept):
    table, decisions = swept
    assert table.index.tolist() == SETUP.skews_ms == sorted(decisions["app"])
    assert table.loc[0, "app peak"] == 10 and (table["app peak"].iloc[1:] > 10).all()
    assert (table["app peak"] < 3 * 10).all() and (table["Redis peak"] == 10).all()
    assert (table["Redis largest |error| (ms)"] == 0).all()
    # The fixed window's stored window never moves backwards: under skew it keeps
    # limiting (about as many rejections as without skew), at about 2x the limit.
    fixed, rejected = table["fixed peak"], table["fixed rejected"]
    assert fixed[0] > 10 and (fixed >= fixed[0]).all() and fixed.max() <= 2.5 * 10
    assert (abs(rejected - rejected[0]) <= 0.05 * rejected[0]).all()
    assert (fixed > table["app peak"]).all() and (rejected < table["app rejected"]).all()
    # The Redis clock at every skew decides as the app clock without skew.
    assert all(d.equals(decisions["app"][0]) for d in decisions["redis"].values())
    assert not decisions["app"][250].equals(decisions["app"][0])


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
    lines = _lines(clock_skew.peaks_figure(SETUP, table))
    assert lines[clock_skew.APP_LABEL][0].tolist() == SETUP.skews_ms
    for label, column in [
        (clock_skew.APP_LABEL, "app peak"),
        (clock_skew.REDIS_LABEL, "Redis peak"),
        (clock_skew.FIXED_LABEL, "fixed peak"),
    ]:
        assert lines[label][1].tolist() == table[column].tolist()

    lines = _lines(clock_skew.errors_figure(SETUP, table))
    assert lines["app clock: mean |error|"][1].tolist() == table["app mean |error| (ms)"].tolist()

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
    for label in (clock_skew.APP_LABEL, clock_skew.REDIS_LABEL, clock_skew.FIXED_LABEL):
        assert np.array_equal(shown[label][1], drawn[label][1])


def test_parameters_change_the_plotted_data():
    base = _lines(clock_skew.figure(**QUICK))
    more = _lines(clock_skew.figure(replicas=5, **QUICK))
    assert (more[clock_skew.APP_LABEL][1] != base[clock_skew.APP_LABEL][1]).any()
    assert 10 < more[clock_skew.APP_LABEL][1].max() < 5 * 10
    lower = _lines(clock_skew.figure(limit=4, **QUICK))
    assert (lower[clock_skew.REDIS_LABEL][1] == 4).all()
    narrow = _lines(clock_skew.figure(max_skew_ms=500, **QUICK))
    assert narrow[clock_skew.APP_LABEL][0].tolist() == [0, 250, 500]


@pytest.mark.parametrize("change", [{"replicas": 1}, {"max_skew_ms": 0}])
def test_edge_cases_draw(change):
    skews, app = _lines(clock_skew.figure(**change, **QUICK))[clock_skew.APP_LABEL]
    assert (app == 10).all()  # one replica, or no skew: exact
    assert len(skews) == (1 if change.get("max_skew_ms") == 0 else 9)


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
