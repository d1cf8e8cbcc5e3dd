"""Chapter 3's explore figure: fleet memory per algorithm from the stored table."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from ratelimit.lab import memory  # noqa: E402
from ratelimit.lab.chapters import memory_per_key  # noqa: E402
from ratelimit.lab.plotting import explorer  # noqa: E402


def bar_heights(fig):
    return [round(p.get_height()) for p in fig.axes[0].patches]


def test_default_figure_is_labelled_and_shows_the_stored_fleet():
    fig = memory_per_key.figure()
    try:
        (ax,) = fig.axes
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
        assert "bytes" in ax.get_ylabel()
        assert ax.get_legend() is not None
        table = memory.load_table(memory_per_key._CHECKOUT_TABLE)
        fleet = memory.fleet_memory(table, [10**7], [1_000])
        assert bar_heights(fig) == fleet.total_bytes.tolist()  # SERIES follows table order
    finally:
        plt.close(fig)


def test_parameters_change_the_bars():
    default = memory_per_key.figure()
    fewer = memory_per_key.figure(active_keys=10**4)
    lower = memory_per_key.figure(limit=129)
    try:
        ten_million, ten_thousand = bar_heights(default), bar_heights(fewer)
        assert ten_thousand != ten_million
        assert [h * 1_000 for h in ten_thousand] == ten_million
        # A lower limit shrinks the sliding log only; the O(1) bars stay.
        at_129 = bar_heights(lower)
        assert at_129[:2] != ten_million[:2] and at_129[2:] == ten_million[2:]
    finally:
        for fig in (default, fewer, lower):
            plt.close(fig)


def test_table_argument_and_unknown_limit():
    table = memory.load_table(memory_per_key._CHECKOUT_TABLE)
    fig = memory_per_key.figure(table=table.assign(bytes_per_key=table.bytes_per_key * 2))
    default = memory_per_key.figure()
    try:
        assert bar_heights(fig) == [2 * h for h in bar_heights(default)]
    finally:
        plt.close(fig)
        plt.close(default)
    with pytest.raises(ValueError, match="limit"):
        memory_per_key.figure(limit=7, table=table)


def test_explorer_builds_and_redraws_on_a_slider_move():
    calls = []
    real = memory_per_key.figure

    def figure(*, active_keys=10**7, limit=1_000):
        calls.append((active_keys, limit))
        return real(active_keys=active_keys, limit=limit)

    widget = explorer(figure, **memory_per_key.SLIDERS)
    assert calls == [(10**7, 1_000)]  # drawn once, at the chapter's defaults
    keys, limit = widget.children[:2]
    assert (keys.description, limit.description) == ("active_keys", "limit")
    assert keys.value == 10**7 and limit.value == 1_000
    limit.value = 129
    assert calls[-1] == (10**7, 129)
    keys.value = 10**3
    assert calls[-1] == (10**3, 129)
    plt.close("all")
