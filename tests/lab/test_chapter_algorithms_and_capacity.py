"""Chapter 5's explore figure: shards needed per algorithm for a fleet, redrawn by sliders."""

from __future__ import annotations

import functools
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import ipywidgets  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from ratelimit.lab import memory  # noqa: E402
from ratelimit.lab.chapters import algorithms_and_capacity as explore_capacity  # noqa: E402
from ratelimit.lab.plotting import explorer  # noqa: E402

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


@pytest.fixture(scope="module")
def table():
    return memory.load_table(NOTEBOOKS / "data" / "memory_per_key.csv")


def steps(fig):
    """(label, x, y) of each algorithm's step line, in legend order."""
    return [
        (line.get_label(), np.asarray(line.get_xdata()), np.asarray(line.get_ydata()))
        for line in fig.axes[0].get_lines()
        if not line.get_label().startswith("_")
    ]


def test_default_figure_is_titled_labelled_and_tells_the_chapters_story(table):
    fig = explore_capacity.figure(table=table)
    try:
        assert isinstance(fig, matplotlib.figure.Figure)
        (ax,) = fig.axes
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
        assert "shards" in ax.get_ylabel() and "requests/s" in ax.get_xlabel()
        assert ax.get_legend() is not None
        lines = steps(fig)
        assert len(lines) == 5
        shards_at_a_million = {label.split(":")[0]: y[x == 1_000_000][0] for label, x, y in lines}
        # Section 7's numbers: the full log needs 13 shards, the O(1) algorithms 2.
        assert shards_at_a_million["sliding log, keys full"] == 13
        assert shards_at_a_million["sliding log, steady state"] == 3
        assert {shards_at_a_million[a] for a in ["fixed window", "GCRA (token bucket)"]} == {2}
    finally:
        plt.close(fig)


def test_the_stored_table_is_read_relative_to_the_notebooks(table, monkeypatch):
    monkeypatch.chdir(NOTEBOOKS)
    fig, ref = explore_capacity.figure(), explore_capacity.figure(table=table)
    try:
        for (_, _, y), (_, _, y_ref) in zip(steps(fig), steps(ref), strict=True):
            assert np.array_equal(y, y_ref)
    finally:
        plt.close(fig)
        plt.close(ref)


@pytest.mark.parametrize(
    "change", [{"limit": 100}, {"headroom": 0.2}, {"rate_per_key": 0.5}, {"window_s": 60}]
)
def test_a_parameter_changes_the_plotted_data(table, change):
    before = explore_capacity.figure(table=table)
    after = explore_capacity.figure(table=table, **change)
    try:
        old, new = steps(before), steps(after)
        assert any(
            not np.array_equal(y0, y1) for (_, _, y0), (_, _, y1) in zip(old, new, strict=True)
        )
    finally:
        plt.close(before)
        plt.close(after)


def test_active_keys_moves_the_marker_and_the_legend(table):
    fig = explore_capacity.figure(table=table, active_keys=1e8)
    try:
        labels = [label for label, _, _ in steps(fig)]
        assert labels[0] != "sliding log, keys full: 13 shards"
        assert all(int(label.split(": ")[1].split()[0].replace(",", "")) > 100 for label in labels)
    finally:
        plt.close(fig)


def test_sliders_build_and_redraw(table):
    calls = []

    @functools.wraps(explore_capacity.figure)
    def draw(**values):
        calls.append(values)
        return explore_capacity.figure(table=table, **values)

    sliders = {
        "active_keys": ipywidgets.FloatLogSlider(value=1e6, base=10, min=3, max=8, step=0.1),
        "rate_per_key": ipywidgets.FloatLogSlider(value=0.05, base=10, min=-3, max=1, step=0.1),
        "limit": ipywidgets.FloatLogSlider(value=1_000, base=10, min=0, max=5, step=0.1),
        "headroom": (0.0, 0.9, 0.05),
    }
    widget = explorer(draw, **sliders)
    assert len(calls) == 1 and calls[0]["headroom"] == 0.5  # the figure's own default
    assert [c.description for c in widget.children[:4]] == list(sliders)
    widget.children[2].value = 100.0
    assert len(calls) == 2 and calls[-1]["limit"] == 100.0
    plt.close("all")
