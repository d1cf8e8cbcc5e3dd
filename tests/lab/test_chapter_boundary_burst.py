"""Chapter 1's module: the attack and Poisson tables it computes, the real script's
checks, and figures that draw exactly those numbers; the sliders redraw the Explore one."""

from __future__ import annotations

import functools
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from ratelimit import algorithms  # noqa: E402
from ratelimit.lab import records  # noqa: E402
from ratelimit.lab.chapters import boundary_burst as bb  # noqa: E402
from ratelimit.lab.plotting import COLORS, explorer  # noqa: E402

RECORDS = Path(__file__).parents[2] / "notebooks" / "data" / "records"
LABELS = ["fixed window", "sliding log", "sliding-window counter", "GCRA (token bucket)"]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _bar_heights(fig: Figure) -> list[float]:
    (ax,) = fig.axes
    return [patch.get_height() for patch in ax.patches]


def test_the_algorithms_come_from_the_registry_fixed_window_first():
    assert [a.label for a in bb.ORDER] == LABELS
    assert set(bb.ORDER) == set(algorithms.ALGORITHMS)
    assert bb.FIXED is algorithms.get("fw") and bb.LOG is algorithms.get("log")


def test_the_attack_is_two_bursts_around_the_boundary():
    table = bb.bursts()
    assert table.requests.tolist() == [bb.LIMIT, bb.LIMIT]
    assert table["first (ms)"].tolist() == [990, 1000]
    assert table["last (ms)"].tolist() == [999, 1009]
    wider = bb.bursts(limit=4, window_s=3)
    assert wider.requests.tolist() == [4, 4]
    assert wider["last (ms)"].iloc[0] < 3000 <= wider["first (ms)"].iloc[1]


@pytest.mark.parametrize("limit, window_s", [(1, 1), (10, 1), (7, 3), (50, 5)])
def test_fixed_window_admits_twice_the_limit_at_the_boundary(limit, window_s):
    table = bb.attack_table(limit, window_s)
    assert table.index.tolist() == LABELS
    assert table[f"admitted of {2 * limit}"].tolist() == [2 * limit, limit, limit, limit]
    assert table[bb.PEAK].tolist() == [2 * limit, limit, limit, limit]


def test_admitted_by_burst_splits_at_the_boundary():
    table = bb.admitted_by_burst(limit=5, window_s=2)
    assert table.columns.tolist() == [
        "admitted before 2000 ms",
        "admitted from 2000 ms on",
        "rejected",
    ]
    assert table.loc["fixed window"].tolist() == [5, 5, 0]
    assert table.loc["sliding log"].tolist() == [5, 0, 5]


def test_rolling_counts_peak_where_the_metric_says():
    counts = bb.rolling_counts()
    assert counts.index[0] == 900 and counts.index[-1] == 2100
    assert counts.columns.tolist() == ["fixed window", "sliding log"]
    assert counts.max().tolist() == bb.attack_table()[bb.PEAK].iloc[:2].tolist()
    # All 20 admitted lie in every window ending in [1009, 1990) ms, and none at 2100.
    assert (counts.loc[1009:1989, "fixed window"] == 20).all()
    assert counts.loc[1990, "fixed window"] < 20 and counts.loc[2100].tolist() == [0, 0]


def test_poisson_table_rows_and_bounds():
    table = bb.poisson_table(rate_multiples=[0.5, 2], duration_s=20, seed=3)
    assert table.index.tolist() == ["0.5x", "2x"]
    assert table["requests per second"].tolist() == [5.0, 20.0]
    assert table.columns[-4:].tolist() == LABELS
    assert (table["sliding log"] == table["offered, busiest second"].clip(upper=10)).all()
    assert (table["fixed window"] <= 20).all() and (table["GCRA (token bucket)"] <= 19).all()
    assert not table.equals(bb.poisson_table(rate_multiples=[0.5, 2], duration_s=20, seed=4))


def test_real_script_admits_the_limit_and_leaves_a_small_key():
    # A long window: the checks run on the wall clock, and must all fall in one window.
    table, key = bb.real_script(3, 60, extra=2, identity="test-chapter-1")
    assert table.index.tolist() == [1, 2, 3, 4, 5]
    assert table.allowed.tolist() == [True, True, True, False, False]
    assert table.remaining.tolist() == [2, 1, 0, 0, 0]
    assert (table["retry_after (s)"].iloc[3:] >= 1).all()
    assert key["members"] == 3 and 0 < key["ttl_ms"] <= 60_000
    facts = bb.key_facts(table, key, 3, 60)
    assert list(facts) == [
        "admitted == 3",
        "rejected == 2",
        "every rejection has retry_after >= 1 s",
        "ZCARD <= limit",
        "0 < PTTL <= window (ms)",
    ]
    assert all(facts.values())
    assert not bb.key_facts(table, {"members": 4, "ttl_ms": 0}, 3, 60)["ZCARD <= limit"]


@pytest.mark.parametrize(
    "call",
    [
        lambda: bb.attack(limit=0),
        lambda: bb.attack(window_s=0),
        lambda: bb.poisson_table(rate_multiples=[-1]),
        lambda: bb.decide("nope", bb.attack(), bb.LIMIT, bb.WINDOW_S),
    ],
)
def test_bad_input_is_refused(call):
    with pytest.raises(ValueError):
        call()


def test_section_figures_draw_the_computed_data():
    fig = bb.attack_figure()
    (ax,) = fig.axes
    assert ax.get_title() and ax.get_xlabel() == "request time (ms)"
    # Fixed window: 20 admitted on row 1; sliding log: 10 admitted, 10 rejected on row 0.
    points = [c.get_offsets() for c in ax.collections]
    assert [len(p) for p in points] == [20, 0, 10, 10]

    fig = bb.rolling_figure()
    steps = {line.get_label(): line.get_ydata() for line in fig.axes[0].get_lines()}
    counts = bb.rolling_counts()
    for label in counts:
        assert np.array_equal(steps[label], counts[label].to_numpy())

    table = bb.poisson_table()
    fig = bb.poisson_figure()
    assert _bar_heights(fig) == table[LABELS].to_numpy().T.ravel().tolist()
    colors = [bars.patches[0].get_facecolor() for bars in fig.axes[0].containers]
    assert colors == [matplotlib.colors.to_rgba(COLORS[a.name]) for a in bb.ORDER]


def test_explore_figure_is_titled_and_draws_peaks():
    fig = bb.figure()
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    assert ax.get_title() and ax.get_xlabel()
    assert "window" in ax.get_ylabel() and "(requests)" in ax.get_ylabel()
    assert set(LABELS) <= set(ax.get_legend_handles_labels()[1])
    data = bb.peaks()
    assert list(data) == [bb.ATTACK, bb.poisson_label(bb.RATE_MULTIPLE, bb.LIMIT, bb.WINDOW_S)]
    # Per algorithm, the attack then Poisson; fixed window first, twice the limit.
    assert _bar_heights(fig) == [data[g][label] for label in LABELS for g in data]
    assert _bar_heights(fig)[0] == 2 * bb.LIMIT


def test_peaks_are_the_tables_numbers():
    data = bb.peaks(rate_multiple=5, seed=0)
    assert data[bb.ATTACK] == bb.attack_table()[bb.PEAK].to_dict()
    poisson = bb.poisson_table(rate_multiples=[5]).loc["5x", LABELS]
    assert data[bb.poisson_label(5, bb.LIMIT, bb.WINDOW_S)] == poisson.to_dict()


@pytest.mark.parametrize("change", [{"limit": 20}, {"rate_multiple": 5.0}, {"seed": 1}])
def test_a_parameter_change_changes_the_bars(change):
    assert _bar_heights(bb.figure(**change)) != _bar_heights(bb.figure())


def test_the_window_is_drawn_in_seconds():
    # Scaling the window at a fixed multiple of the limit only stretches the traffic in
    # time (the Poisson stream is scaled, the attack keeps its shape), so the peaks may
    # stay the same: the window shows in the labels and the traffic's rate instead.
    assert "1 s window" in bb.figure().axes[0].get_ylabel()
    wider = bb.figure(window_s=2)
    assert "2 s window" in wider.axes[0].get_ylabel()
    ticks = [t.get_text() for t in wider.axes[0].get_xticklabels()]
    assert "(10 req/s)" in ticks[1]  # 2x the limit of 10 per 2 s


def test_sliders_start_at_the_defaults_and_redraw():
    calls = []

    @functools.wraps(bb.figure)
    def figure(**values):
        calls.append(values)
        return bb.figure(**values)

    widget = explorer(figure, **bb.SLIDERS)
    controls = widget.children[: len(bb.SLIDERS)]
    assert [c.description for c in controls] == list(bb.SLIDERS)
    assert [c.value for c in controls] == [bb.LIMIT, bb.WINDOW_S, bb.RATE_MULTIPLE, bb.SEED]
    assert len(calls) == 1  # drawn once, at the defaults
    controls[0].value = 20
    assert len(calls) == 2
    assert calls[-1]["limit"] == 20 and calls[-1]["window_s"] == bb.WINDOW_S


def test_sliders_start_at_the_parameters_the_chapter_passes():
    # The chapter hands explorer a partial of figure with its own parameters.
    draw = functools.partial(bb.figure, limit=7, seed=3, duration_s=10)
    widget = explorer(draw, **bb.SLIDERS)
    values = {c.description: c.value for c in widget.children[: len(bb.SLIDERS)]}
    assert values == {"limit": 7, "window_s": bb.WINDOW_S, "rate_multiple": 2.0, "seed": 3}


def test_the_readme_texts_quote_what_the_module_computes():
    # The committed records are what the README quotes; at the chapter's defaults the
    # module must compute the same numbers, and every field of the texts is recorded.
    values = records.load("01_boundary_burst", RECORDS)["values"]
    for template in (bb.SUMMARY, bb.HEADLINE):
        assert records.fill(template, values, "boundary_burst")
    recorded = {name: v["value"] for name, v in values.items()}
    attack = bb.attack_table()[bb.PEAK]
    assert recorded["fixed_attack_peak"] == attack["fixed window"] == 2 * bb.LIMIT
    assert recorded["others_attack_peak"] == attack.drop("fixed window").max() == bb.LIMIT
    assert recorded["attack_requests"] == len(bb.attack()) == 2 * recorded["attack_burst"]
    poisson = bb.poisson_table()
    assert recorded["fixed_poisson_peak"] == poisson["fixed window"].max()
    assert recorded["log_poisson_peak"] == poisson["sliding log"].max() == bb.LIMIT
    assert recorded["gcra_poisson_peak"] == poisson["GCRA (token bucket)"].max()
    assert (recorded["rate_min"], recorded["rate_max"]) == (
        min(bb.RATE_MULTIPLES),
        max(bb.RATE_MULTIPLES),
    )
    assert bb.TITLE and "{" not in bb.TITLE
