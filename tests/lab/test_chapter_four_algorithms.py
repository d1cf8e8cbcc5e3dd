"""Chapter 0's module: the shared trace, each model's state read over time, the scripts
read from the package, the costs table, and a figure that draws exactly that state."""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from ratelimit import algorithms, scripts  # noqa: E402
from ratelimit.lab import memory, records  # noqa: E402
from ratelimit.lab.chapters import four_algorithms as fa  # noqa: E402

RECORDS = Path(__file__).parents[2] / "notebooks" / "data" / "records"
LABELS = ["sliding log", "fixed window", "sliding-window counter", "GCRA (token bucket)"]
ALL = "admitted in all (19)"


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_the_trace_is_a_burst_then_a_trickle_from_the_next_boundary():
    ms = (fa.trace().time * 1000).round().astype(int).tolist()
    assert ms[:8] == list(range(800, 880, 10))
    assert ms[8:] == list(range(1000, 3001, 200))
    assert set(fa.trace().identity) == {fa.IDENTITY} and (fa.trace().cost == 1).all()
    later = fa.trace(window_s=2, burst_at_ms=2500, trickle_until_ms=6000).time * 1000
    later = later.round().astype(int)
    assert later.iloc[8] == 4000  # the trickle starts at the first boundary after the burst


def test_admitted_per_algorithm_on_the_trace():
    table = fa.admitted_table()
    assert table.index.tolist() == LABELS
    assert table["admitted of the burst (8)"].tolist() == [5, 5, 5, 5]
    assert table[ALL].tolist() == [12, 16, 14, 16]
    assert table["max in any rolling window"].tolist() == [5, 9, 8, 9]


def test_stepping_one_request_at_a_time_decides_like_a_replay():
    assert fa.replayed_alike()
    assert fa.replayed_alike(limit=3, window_s=2)


def test_the_exercises_answers():
    assert fa.admitted_table(3)[ALL][["fixed window", "sliding log"]].tolist() == [10, 8]
    assert fa.admitted_table(burst=2).loc["GCRA (token bucket)", ALL] == 13


def test_what_the_log_stores_is_its_count_in_the_window():
    held = fa.stored("log")
    assert held.index[0] == 0 and held.index[-1] == 4000
    assert held.loc[799, "in the window"] == 0 and held.loc[840, "in the window"] == 5
    assert held.loc[1799, "in the window"] == 5 and held.loc[1800, "in the window"] == 5
    assert held["in the window"].max() == fa.LIMIT
    assert held.loc[4000, "in the window"] == 0  # the last entry (3000 ms) has left


def test_the_fixed_window_forgets_at_the_boundary():
    held = fa.stored("fw")
    assert held.loc[999, "count"] == 5 and held.loc[1000, "count"] == 1
    assert held.loc[1999, "count"] == 5 and held.loc[2000, "count"] == 1


def test_the_counters_estimate_is_the_formula():
    held = fa.stored("swc")
    row = held.loc[1100]
    assert (row.previous, row.current) == (5, 0)
    assert row.estimate == pytest.approx(5 * (1000 - 100) / 1000)
    assert held.loc[2100, "previous"] == 4  # 1000, 1200, 1400, 1600 admitted; 1800 not
    formula = held.previous * (1000 - held.index % 1000) / 1000 + held.current
    assert np.allclose(held.estimate, formula)


def test_gcra_stores_the_tat_ahead_of_now():
    held = fa.stored("gcra")
    assert (held["tau - T (ms)"] == 800).all()
    assert held.loc[799, "TAT - t (ms)"] == 0
    assert held.loc[840, "TAT - t (ms)"] == pytest.approx(800 + 5 * 200 - 840)
    assert held["TAT - t (ms)"].min() >= 0 and held.loc[4000, "TAT - t (ms)"] == 0
    wider = fa.stored("gcra", burst=2)
    assert (wider["tau - T (ms)"] == 200).all()


def test_scripts_are_read_from_the_package():
    for name in fa.SCRIPTS:
        text = fa.script_source(name)
        assert text.startswith("until true" if name == "epilogue" else "--")
        assert text.rstrip("\n") in scripts.source(name)
    shown = fa.show_script("gcra")
    assert "```lua\n" in shown.data and fa.script_source("gcra").rstrip() in shown.data
    with pytest.raises(ValueError):
        fa.script_source("../pyproject")


STORAGES = ["sliding log, compact storage (default)", "sliding log, sorted-set storage"]
ENTRIES = (algorithms.COMPACT_LOG, algorithms.SLIDING_LOG, *algorithms.ALGORITHMS[1:])


def test_costs_come_from_the_stored_table_and_the_registry():
    table = fa.costs_table()
    assert table.index.tolist() == [*STORAGES, *LABELS[1:]]
    # The stored table's rows, read here by hand: a skiplist's bytes vary a little with
    # each measurement (its nodes' heights are random), and a script change moves the
    # others, so the table is the one source of the expected sizes.
    with open(memory.STORED_TABLE, newline="") as f:
        stored = {
            (row["algorithm"], row["member_format"], int(row["limit"])): int(row["bytes_per_key"])
            for row in csv.DictReader(f)
        }
    rows = [("log", "compact"), ("log", "script"), ("fw", ""), ("swc", ""), ("gcra", "")]
    for limit in (10, 1000):
        expected = [stored[(algorithm, member, limit)] for algorithm, member in rows]
        assert table[f"bytes per key at limit {limit:,}"].tolist() == expected
    for algorithm, (_, row) in zip(ENTRIES, table.iterrows(), strict=True):
        assert row["commands, admitted"] == algorithm.commands.admit
        assert row["commands, rejected"] == algorithm.commands.reject
        assert row["exact"] == algorithm.exact


def test_running_the_scripts_finds_the_registrys_counts():
    for algorithm in ENTRIES:
        found = fa.script_commands(algorithm)
        counts = algorithm.commands
        assert len(found["opening (empty key)"]) == counts.opening
        assert len(found["admitted"]) == counts.admit
        assert len(found["admitted, cost 2"]) == counts.admit + counts.per_extra_unit
        assert len(found["rejected"]) == counts.reject
    assert fa.script_commands(algorithms.COMPACT_LOG)["admitted"] == ["HGET", "HSET", "PEXPIRE"]
    assert fa.script_commands(algorithms.GCRA)["rejected"] == ["SET NX GET PX"]
    table = fa.commands_table()
    assert table.index.tolist() == [*STORAGES, *LABELS[1:]]
    assert table.loc[STORAGES[0], "rejected"] == "1: HGET"


def test_the_figure_draws_the_stored_state_and_the_decisions():
    fig = fa.figure()
    assert len(fig.axes) == 4
    for ax, algorithm in zip(fig.axes, fa.ORDER, strict=True):
        held = fa.stored(algorithm.name)
        lines = {line.get_label(): line for line in ax.get_lines()}
        main = fa._READINGS[algorithm].main
        assert np.array_equal(lines[main].get_ydata(), held[main].to_numpy())
        admitted, rejected = (c.get_offsets() for c in ax.collections[:2])
        decided = fa.decisions(algorithm.name)
        assert len(admitted) == decided.allowed.sum() and len(rejected) == (~decided.allowed).sum()
        assert f"{int(decided.allowed.sum())} of 19 admitted" in ax.get_title()


@pytest.mark.parametrize(
    "call",
    [
        lambda: fa.trace(burst_requests=0),
        lambda: fa.trace(trickle_every_ms=0),
        lambda: fa.decisions("nope"),
        lambda: fa.decisions("log", limit=0),
    ],
)
def test_bad_input_is_refused(call):
    with pytest.raises(ValueError):
        call()


def test_the_readme_texts_quote_what_the_module_computes():
    values = records.load("00_four_algorithms", RECORDS)["values"]
    for template in (fa.SUMMARY, fa.HEADLINE):
        assert records.fill(template, values, "four_algorithms")
    recorded = {name: v["value"] for name, v in values.items()}
    table = fa.admitted_table()
    for algorithm, label in zip(fa.ORDER, LABELS, strict=True):
        assert recorded[f"{algorithm.name}_admitted"] == table.loc[label, ALL]
        assert recorded[f"{algorithm.name}_peak"] == table.loc[label, "max in any rolling window"]
    assert recorded["trace_requests"] == len(fa.trace())
    costs = fa.costs_table()[f"bytes per key at limit {fa.QUOTED_LIMIT:,}"]
    assert recorded["log_bytes"] == costs[STORAGES[1]]
    assert recorded["o1_max_bytes"] == costs[LABELS[1:]].max()
    assert fa.TITLE and "{" not in fa.TITLE
