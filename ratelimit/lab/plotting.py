"""What every chapter's figures share: one colour per algorithm, the gallery, the sliders.

- `COLORS`: the colour of each algorithm (by its tag in `ratelimit.algorithms`), the
  same in every figure of the book.
- `save_for_gallery(figure, name)`: the README's gallery image, written only when the
  main job asks for it.
- `explorer(draw, **sliders)`: the "Explore" section of a chapter, sliders that call a
  chapter module's figure function again and show what it draws:

      from ratelimit.lab.chapters import boundary_burst
      from ratelimit.lab.plotting import explorer
      boundary_burst.figure()                                        # the default figure
      explorer(boundary_burst.figure, limit=(1, 50), rate_multiple=(1.0, 10.0))  # sliders

The cell holding the sliders carries two tags: `WIDGET_TAG`, so the book (tools/book.py) leaves
its output out (a widget needs a live kernel), and `nbval-ignore-output`, since nbval
does not capture an Output widget: the figure drawn inside it arrives as an extra
output of its own, unlike in nbconvert or JupyterLab.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ratelimit import algorithms

WIDGET_TAG = "explore-widget"

# Handed out in the registry's order, so an algorithm added there gets the next one.
PALETTE = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:olive")
COLORS = dict(zip(algorithms.NAMES, PALETTE, strict=False))
"""Each algorithm's colour, by its tag (`ratelimit.algorithms`)."""
GALLERY_DIR = Path("figures")  # beside the notebooks, which run in their own folder


def save_for_gallery(figure: Any, name: str) -> Path | None:
    """Write `figure` to figures/<name>.png when `make refresh` asks for it.

    `make refresh` sets RATELIMIT_WRITE_FIGURES=1, so the README's gallery is refreshed
    with the chapters; test runs (nbval) leave the committed files alone.
    """
    if os.environ.get("RATELIMIT_WRITE_FIGURES") != "1":
        return None
    GALLERY_DIR.mkdir(exist_ok=True)
    path = GALLERY_DIR / f"{name}.png"
    figure.savefig(path, dpi=100, bbox_inches="tight", metadata={"Software": None})
    return path


def parameters_of(
    compute: Callable[..., Any], **extra: Any
) -> Callable[[Callable[..., Any]], Any]:
    """`@parameters_of(compute)` on `def figure(**params)`: the figure takes exactly the
    parameters of `compute` (the function or dataclass whose result it draws), receives
    all of them by name with the defaults filled in, and shows them in its signature,
    where `explorer` reads the sliders' starting values. The parameters are listed once.
    `extra` adds keyword-only parameters of the figure's own (name=default)."""
    signature = inspect.signature(compute)
    keyword = inspect.Parameter.KEYWORD_ONLY
    own = [inspect.Parameter(name, keyword, default=d) for name, d in extra.items()]
    signature = signature.replace(parameters=[*signature.parameters.values(), *own])

    def decorate(draw: Callable[..., Any]) -> Any:
        @functools.wraps(draw)
        def figure(*args: Any, **params: Any) -> Any:
            bound = signature.bind(*args, **params)
            bound.apply_defaults()
            return draw(**bound.arguments)

        figure.__signature__ = signature.replace(  # type: ignore[attr-defined]
            return_annotation=inspect.signature(draw).return_annotation
        )
        return figure

    return decorate


def explorer(draw: Callable[..., Any], /, **sliders: Any) -> Any:
    """An ipywidgets `interactive` that calls `draw(**values)` and shows its figure.

    Each keyword is a widget abbreviation as `ipywidgets.interactive` takes it: a
    `(min, max)` or `(min, max, step)` tuple for a slider, a list for a drop-down, or a
    widget. The figure is drawn again whenever a control moves.
    """
    import inspect

    import ipywidgets
    import matplotlib.pyplot as plt

    # Controls start at draw's own defaults (ipywidgets would start a slider mid-range).
    defaults = {
        name: p.default
        for name, p in inspect.signature(draw).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    unset = inspect.Parameter.empty
    controls = {
        name: ipywidgets.interactive.widget_from_abbrev(abbrev, defaults.get(name, unset))
        for name, abbrev in sliders.items()
    }
    for name, control in controls.items():
        control.description = name

    def show(**values: Any) -> None:
        figure = draw(**values)
        plt.show()
        plt.close(figure)

    return ipywidgets.interactive(show, **controls)
