"""Chapter 4's explore figure: labelled, driven by its parameters, the same counts as
the embedded backend, and redrawn by the explorer's sliders."""

from __future__ import annotations

import asyncio
import inspect

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from ratelimit.lab.chapters import atomicity_and_failures as atomicity  # noqa: E402
from ratelimit.lab.plotting import explorer  # noqa: E402


def bars(fig: Figure) -> list[tuple[float, float]]:
    """(left edge, height) of every non-empty histogram bar of the figure's axes."""
    (ax,) = fig.axes
    return [(p.get_x(), p.get_height()) for p in ax.patches if p.get_height() > 0]


def test_figure_is_titled_and_labelled():
    fig = atomicity.figure()
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    labels = ax.get_legend_handles_labels()[1]
    assert sorted(labels) == sorted(["limit (10)", atomicity.NON_ATOMIC, atomicity.LUA])
    plt.close(fig)


def test_defaults_tell_the_chapter_story():
    counts = atomicity.race_counts()
    assert counts[atomicity.NON_ATOMIC] == [50] * 100  # every request got in, every round
    assert counts[atomicity.LUA] == [10] * 100  # exactly the limit, every round


def test_a_parameter_change_changes_the_bars():
    default, fewer = atomicity.figure(), atomicity.figure(concurrency=20, rounds=30)
    # One bar per limiter: all rounds at 50 (non-atomic) and at 10 (Lua), then at 20 and 10.
    assert sorted(bars(default)) == [(9.5, 100), (49.5, 100)]
    assert sorted(bars(fewer)) == [(9.5, 30), (19.5, 30)]
    plt.close(default)
    plt.close(fewer)


def test_below_the_limit_both_admit_everything():
    counts = atomicity.race_counts(concurrency=5, limit=10, rounds=5)
    assert counts == {atomicity.NON_ATOMIC: [5] * 5, atomicity.LUA: [5] * 5}


@pytest.mark.parametrize(
    "params",
    [
        {"concurrency": 12, "limit": 10, "rounds": 3},
        {"concurrency": 8, "limit": 10, "rounds": 2},
        {"concurrency": 20, "limit": 1, "rounds": 2},
    ],
)
def test_in_memory_race_matches_the_embedded_backend(params):
    embedded = asyncio.run(atomicity.embedded_counts(**params))
    assert atomicity.race_counts(**params) == embedded


def test_sliders_redraw_the_figure():
    calls = []

    def draw(**values):
        calls.append(values)
        return atomicity.figure(**values)

    draw.__signature__ = inspect.signature(atomicity.figure)  # its defaults start the sliders
    widget = explorer(draw, concurrency=(2, 100), limit=(1, 50), rounds=(5, 100))
    assert calls == [{"concurrency": 50, "limit": 10, "rounds": 100}]  # the defaults
    widget.children[2].value = 20
    assert calls[-1] == {"concurrency": 50, "limit": 10, "rounds": 20}
    assert [c.description for c in widget.children[:3]] == ["concurrency", "limit", "rounds"]
    plt.close("all")
