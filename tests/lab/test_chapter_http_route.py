"""Chapter 6's explore figure: labelled, driven by its parameters, and behind sliders."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from ratelimit.lab.chapters import http_route  # noqa: E402
from ratelimit.lab.plotting import explorer  # noqa: E402


def plotted(fig: Figure) -> list[np.ndarray]:
    """Every line's y data and every bar's height, axes by axes."""
    data = []
    for ax in fig.axes:
        data += [np.asarray(line.get_ydata(), dtype=float) for line in ax.lines]
        data += [np.array([bar.get_height() for bar in c]) for c in ax.containers]
    return data


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


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


def test_defaults_tell_the_chapters_story():
    # Section 4 of the chapter, with its parameters: the hammering client gets exactly
    # the limit and more refusals than look-ups; the paced one is never refused.
    hammer = http_route.simulate()
    assert (hammer.requests, hammer.admitted_count, hammer.refused_count) == (215, 100, 115)
    polite = http_route.simulate(client=http_route.HONOURS_RETRY_AFTER)
    assert (polite.admitted_count, polite.refused_count) == (90, 9)
    paced = http_route.simulate(client=http_route.PACED)
    assert (paced.admitted_count, paced.refused_count) == (100, 0)


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


def test_unknown_client_is_refused():
    with pytest.raises(ValueError, match="client must be one of"):
        http_route.simulate(client="patient")


def test_sliders_redraw_the_figure(monkeypatch):
    calls = []
    draw = http_route.figure

    def figure(*, limit=10, client=http_route.HAMMERS, duration_s=10):
        calls.append((limit, client, duration_s))
        return draw(limit=limit, client=client, duration_s=duration_s)

    monkeypatch.setattr(plt, "show", lambda *a, **k: None)
    widget = explorer(figure, limit=(1, 50), client=http_route.CLIENTS, duration_s=(2, 30))
    assert calls == [(10, http_route.HAMMERS, 10)]  # drawn once, at the defaults
    assert [c.description for c in widget.children[:3]] == ["limit", "client", "duration_s"]
    widget.children[0].value = 25
    assert calls[-1] == (25, http_route.HAMMERS, 10)
    widget.children[1].value = http_route.PACED
    assert calls[-1] == (25, http_route.PACED, 10)
    plt.close("all")


def test_explorer_starts_at_the_figures_own_defaults():
    widget = explorer(
        http_route.figure, limit=(1, 50), client=http_route.CLIENTS, duration_s=(2, 30)
    )
    values = [c.value for c in widget.children[:3]]
    assert values == [10, http_route.HAMMERS, 10]
    plt.close("all")
