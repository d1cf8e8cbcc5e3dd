"""Chapter 2's explore figure: labelled, driven by its parameters, and redrawn by the
sliders."""

from __future__ import annotations

import inspect

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from ratelimit.lab.chapters import clock_skew  # noqa: E402
from ratelimit.lab.plotting import explorer  # noqa: E402

# Short traces keep the tests quick; the shape of the story is the same.
QUICK = {"duration_s": 20.0, "skew_step_ms": 250}


def _lines(fig: Figure) -> dict:
    return {line.get_label(): line.get_data() for line in fig.axes[0].get_lines()}


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_figure_is_titled_and_labelled():
    fig = clock_skew.figure(**QUICK)
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    assert ax.get_title() and "ms" in ax.get_xlabel() and "requests" in ax.get_ylabel()
    assert ax.get_legend() is not None
    lines = _lines(fig)
    assert {clock_skew.APP_LABEL, clock_skew.REDIS_LABEL} <= set(lines)


def test_app_clock_drifts_above_the_limit_redis_clock_does_not():
    lines = _lines(clock_skew.figure(**QUICK))
    skews, app = lines[clock_skew.APP_LABEL]
    _, redis = lines[clock_skew.REDIS_LABEL]
    assert skews[0] == 0 and app[0] == 10  # no skew: exact
    # Over the limit at two windows of skew, but far from one full limit per replica:
    # the script never lets the log's time run backwards.
    assert 10 < app[-1] < 3 * 10
    assert (redis == 10).all()


def test_parameters_change_the_plotted_data():
    base = _lines(clock_skew.figure(**QUICK))
    more = _lines(clock_skew.figure(replicas=5, **QUICK))
    assert (more[clock_skew.APP_LABEL][1] != base[clock_skew.APP_LABEL][1]).any()
    assert 10 < more[clock_skew.APP_LABEL][1].max() < 5 * 10
    lower = _lines(clock_skew.figure(limit=4, **QUICK))
    assert (lower[clock_skew.REDIS_LABEL][1] == 4).all()
    narrow = _lines(clock_skew.figure(max_skew_ms=500, **QUICK))
    assert narrow[clock_skew.APP_LABEL][0].tolist() == [0, 250, 500]


def test_one_replica_has_no_skew():
    skews, app = _lines(clock_skew.figure(replicas=1, **QUICK))[clock_skew.APP_LABEL]
    assert len(skews) > 1 and (app == 10).all()


def test_sliders_start_at_the_defaults_and_redraw():
    calls = []

    def draw(**values):
        calls.append(values)
        return clock_skew.figure(**values, **QUICK)

    # explorer reads the defaults from the function it is given: use the real one's.
    draw.__signature__ = inspect.signature(clock_skew.figure)
    widget = explorer(
        draw, replicas=(1, 8), max_skew_ms=(0, 2000, 50), rate=(5.0, 60.0, 5.0), limit=(1, 30)
    )
    assert len(calls) == 1
    assert calls[0] == {"replicas": 3, "max_skew_ms": 2000, "rate": 30.0, "limit": 10}
    widget.children[0].value = 5  # replicas
    assert len(calls) == 2 and calls[-1]["replicas"] == 5
    assert [c.description for c in widget.children[:4]] == [
        "replicas",
        "max_skew_ms",
        "rate",
        "limit",
    ]


def test_explorer_builds_on_the_figure_itself():
    widget = explorer(clock_skew.figure, max_skew_ms=(0, 2000, 50))
    assert widget.children[0].value == 2000
    widget.children[0].value = 100  # redraws without error
    assert widget.children[0].value == 100
