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
    marked = [r for r in plan.recommended if r.window_ms == window_ms]
    for j, r in enumerate(marked):
        ax.axvline(r.limit, linestyle="--", linewidth=1.2, color=f"C{j}",
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


def draw_hours(ax: Axes, plan: LogPlan) -> None:
    """On `ax`: rejected requests per UTC hour of day, side-by-side bars per candidate
    that rejects any."""
    hours = np.arange(24)
    hurt = [c for c in plan.candidates if c.rejected]
    width = 0.8 / max(len(hurt), 1)
    for j, c in enumerate(hurt):
        ax.bar(hours - 0.4 + (j + 0.5) * width, c.rejected_by_hour, width=width,
               label=f"{c.limit_text} {c.label}")  # fmt: skip
    ax.set_xticks(range(0, 24, 3))
    ax.set_xlim(-0.5, 23.5)
    ax.set_xlabel("hour of day (UTC)")
    ax.set_ylabel("requests rejected")
    ax.set_title("When requests are rejected")
    if hurt:
        ax.legend(fontsize="small")


def draw_throttled(ax: Axes, plan: LogPlan) -> None:
    """On `ax`: each candidate's longest throttled stretches (its `top` listed), longest
    first, in seconds."""
    for c in plan.candidates:
        seconds = [t.seconds for t in c.longest_throttled]
        if seconds:
            ax.plot(range(1, len(seconds) + 1), seconds, marker="o", markersize=3,
                    label=f"{c.limit_text} {c.label}")  # fmt: skip
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("client, by rank")
    ax.set_ylabel("longest throttled stretch (s)")
    ax.set_title("Longest throttled stretches (first rejected to next admitted request)")
    if ax.get_lines():
        ax.legend(fontsize="small")


def plan_figure(plan: LogPlan) -> Figure:
    """Every figure of a plan in one: per window planned, the per-client peaks with the
    recommended limits (`draw_peaks`), then rejections by hour (`draw_hours`) and the
    longest throttled stretches (`draw_throttled`)."""
    from matplotlib.figure import Figure

    windows = sorted(plan.client_peaks) if plan.recommended else []
    rows = len(windows) + 2
    fig = Figure(figsize=(8, 3.4 * rows), layout="constrained")
    for i, window_ms in enumerate(windows):
        draw_peaks(fig.add_subplot(rows, 1, i + 1), plan, window_ms)
    draw_hours(fig.add_subplot(rows, 1, rows - 1), plan)
    draw_throttled(fig.add_subplot(rows, 1, rows), plan)
    return fig
