"""Chapter 1's explore figure: labelled, driven by its parameters, and redrawn by the
sliders; its numbers keep the chapter's claim (the fixed window admits 2x at the boundary)."""

from __future__ import annotations

import functools

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from ratelimit.lab.chapters import boundary_burst  # noqa: E402
from ratelimit.lab.plotting import explorer  # noqa: E402


def _bar_heights(fig: Figure) -> list[float]:
    (ax,) = fig.axes
    return [patch.get_height() for patch in ax.patches]


def test_figure_is_titled_and_labelled():
    fig = boundary_burst.figure()
    try:
        assert isinstance(fig, Figure)
        (ax,) = fig.axes
        assert ax.get_title()
        assert "window" in ax.get_ylabel() and "(requests)" in ax.get_ylabel()
        assert ax.get_xlabel()
        labels = ax.get_legend_handles_labels()[1]
        assert set(boundary_burst.COLORS) <= set(labels)
        # Two traffic groups, four algorithms each; fixed window first, twice the limit.
        heights = _bar_heights(fig)
        assert len(heights) == 8
        assert heights[0] == 2 * boundary_burst.LIMIT
    finally:
        plt.close(fig)


@pytest.mark.parametrize("change", [{"limit": 20}, {"rate_multiple": 5.0}, {"seed": 1}])
def test_a_parameter_change_changes_the_bars(change):
    default = boundary_burst.figure()
    changed = boundary_burst.figure(**change)
    try:
        assert _bar_heights(changed) != _bar_heights(default)
    finally:
        plt.close(default)
        plt.close(changed)


def test_the_window_is_drawn_in_seconds():
    # Scaling the window at a fixed multiple of the limit only stretches the traffic in
    # time (the Poisson stream is scaled, the attack keeps its shape), so the peaks may
    # stay the same: the window shows in the labels and the traffic's rate instead.
    default = boundary_burst.figure()
    wider = boundary_burst.figure(window_s=2)
    try:
        assert "1 s window" in default.axes[0].get_ylabel()
        assert "2 s window" in wider.axes[0].get_ylabel()
        ticks = [t.get_text() for t in wider.axes[0].get_xticklabels()]
        assert "(10 req/s)" in ticks[1]  # 2x the limit of 10 per 2 s
    finally:
        plt.close(default)
        plt.close(wider)


@pytest.mark.parametrize("limit, window_s", [(1, 1), (10, 1), (7, 3), (50, 5)])
def test_fixed_window_admits_twice_the_limit_at_the_boundary(limit, window_s):
    attack = boundary_burst.peaks(limit=limit, window_s=window_s)["boundary attack"]
    assert attack["fixed window"] == 2 * limit
    assert {name: peak for name, peak in attack.items() if name != "fixed window"} == {
        "sliding log": limit,
        "sliding-window counter": limit,
        "GCRA (token bucket)": limit,
    }


def test_sliders_start_at_the_defaults_and_redraw():
    calls = []

    @functools.wraps(boundary_burst.figure)
    def figure(**values):
        calls.append(values)
        return boundary_burst.figure(**values)

    widget = explorer(figure, **boundary_burst.SLIDERS)
    controls = widget.children[: len(boundary_burst.SLIDERS)]
    assert [c.description for c in controls] == list(boundary_burst.SLIDERS)
    assert [c.value for c in controls] == [
        boundary_burst.LIMIT,
        boundary_burst.WINDOW_S,
        boundary_burst.RATE_MULTIPLE,
        boundary_burst.SEED,
    ]
    assert len(calls) == 1  # drawn once, at the defaults
    controls[0].value = 20
    assert len(calls) == 2
    assert calls[-1]["limit"] == 20 and calls[-1]["window_s"] == boundary_burst.WINDOW_S
    plt.close("all")
