"""The explore helpers: sliders start at the figure function's defaults and redraw it;
gallery files are written only when the main job asks; every algorithm has a colour."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ratelimit import algorithms  # noqa: E402
from ratelimit.lab.plotting import COLORS, PALETTE, explorer, save_for_gallery  # noqa: E402


def test_every_registered_algorithm_has_a_colour_of_its_own():
    assert list(COLORS) == list(algorithms.NAMES)
    assert len(set(COLORS.values())) == len(COLORS)
    assert len(PALETTE) > len(algorithms.NAMES)  # room for one more
    assert COLORS[algorithms.SLIDING_LOG.name] == "tab:blue"  # the book's figures keep theirs


def test_sliders_start_at_the_defaults_and_redraw():
    calls = []

    def figure(limit=10, rate=5.0, algorithm="log"):
        calls.append((limit, rate, algorithm))
        fig, ax = plt.subplots()
        ax.plot([0, 1], [0, limit])
        return fig

    widget = explorer(figure, limit=(1, 50), rate=(1.0, 100.0), algorithm=["log", "fixed"])
    assert calls == [(10, 5.0, "log")]  # drawn once, at the defaults
    widget.children[0].value = 20
    widget.children[2].value = "fixed"
    assert calls[-1] == (20, 5.0, "fixed")
    assert [c.description for c in widget.children[:3]] == ["limit", "rate", "algorithm"]


def test_gallery_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fig, _ = plt.subplots()
    monkeypatch.delenv("RATELIMIT_WRITE_FIGURES", raising=False)
    assert save_for_gallery(fig, "01_x") is None
    assert not (tmp_path / "figures").exists()
    monkeypatch.setenv("RATELIMIT_WRITE_FIGURES", "1")
    path = save_for_gallery(fig, "01_x")
    assert path is not None and (tmp_path / path).read_bytes().startswith(b"\x89PNG")
    plt.close(fig)


def test_parameters_of_lists_the_parameters_once():
    import inspect

    from ratelimit.lab.plotting import parameters_of

    def compute(*, limit: int = 10, seed: int = 0) -> int:
        return limit + seed

    @parameters_of(compute)
    def figure(**params):
        return params

    assert list(inspect.signature(figure).parameters) == ["limit", "seed"]
    assert figure() == {"limit": 10, "seed": 0}  # every parameter, defaults filled in
    assert figure(seed=3) == {"limit": 10, "seed": 3}
    with pytest.raises(TypeError):
        figure(colour="red")
