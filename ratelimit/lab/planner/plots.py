"""A plan's figures (matplotlib): the spread of per-client peaks with the recommended
limits marked (`peaks_figure`). Figures are made without pyplot's global state, so
they can be saved from scripts and shown in notebooks alike."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from .results import LogPlan


def _window_text(window_ms: int) -> str:
    from .report import _window

    return _window(window_ms)


def draw_peaks(ax: Axes, plan: LogPlan, window_ms: int) -> None:
    """On `ax`: the share of clients whose peak in one rolling window of `window_ms` is
    at most x (a step curve over every client), and each algorithm's recommended limit
    for that window as a vertical line."""
    peaks = np.sort(np.asarray(plan.client_peaks[window_ms]))
    if len(peaks):
        share = np.arange(1, len(peaks) + 1) / len(peaks)
        ax.step(peaks, share, where="post", color="0.2", label="clients")
    for r in plan.recommended:
        if r.window_ms == window_ms:
            ax.axvline(r.limit, linestyle="--", linewidth=1.2,
                       label=f"{r.label}: {r.limit_text}")  # fmt: skip
    if plan.affect is not None:
        ax.axhline(1 - plan.affect, color="0.6", linewidth=0.8)
    if len(peaks) and peaks.max() >= 100 * max(peaks.min(), 1):
        ax.set_xscale("log")
    ax.set_xlabel(f"client's most requested cost in {_window_text(window_ms)}")
    ax.set_ylabel("share of clients at or below")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"Per-client peaks, window {_window_text(window_ms)}")
    ax.legend(fontsize="small", loc="lower right")


def peaks_figure(plan: LogPlan) -> Figure:
    """One panel per window planned: `draw_peaks`."""
    from matplotlib.figure import Figure

    windows = sorted(plan.client_peaks)
    fig = Figure(figsize=(7, 3.2 * max(len(windows), 1)), layout="constrained")
    for i, window_ms in enumerate(windows):
        draw_peaks(fig.add_subplot(len(windows), 1, i + 1), plan, window_ms)
    return fig
