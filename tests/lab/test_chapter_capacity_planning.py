"""Chapter 6's module (capacity_planning): what one key of each planned algorithm weighs,
the plans per scenario for the compact log (the default), the sorted set and the O(1)
algorithms, the policy sweep, and the figure drawn from them."""

from __future__ import annotations

import functools
import math
import string
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import ipywidgets  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from ratelimit import algorithms  # noqa: E402
from ratelimit.lab import capacity, memory  # noqa: E402
from ratelimit.lab.chapters import capacity_planning as planning  # noqa: E402
from ratelimit.lab.plotting import explorer  # noqa: E402

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
BENCH_RECORD = NOTEBOOKS.parent / "bench" / "record.json"
LABELS = [planning.LABELS[a] for a in planning.PLANNED]


@pytest.fixture(scope="module")
def table():
    return memory.load_table(memory.STORED_TABLE)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def steps(fig, panel=0):
    """(label, x, y) of each step line of one panel of the capacity figure, in legend order."""
    return [
        (line.get_label(), np.asarray(line.get_xdata()), np.asarray(line.get_ydata()))
        for line in fig.axes[panel].get_lines()
        if not line.get_label().startswith("_")
    ]


@pytest.fixture(scope="module")
def server_time():
    return planning.bench_server_time(str(BENCH_RECORD))


@pytest.fixture(scope="module")
def chapter_plans(table, server_time):
    named = planning.scenarios(1e6, 0.05, 1_000, 3_600)
    return named, planning.plans(table, named, 1_000, 3_600, server_time, planning.Shard())


def test_server_time_is_the_bench_record(server_time):
    import json

    cost = json.loads(BENCH_RECORD.read_text())["server_cost"]
    assert list(server_time.us_per_check) == list(planning.PLANNED)
    for a in planning.PLANNED:
        case = capacity.bench_case(a, cost["log_storages"])
        assert server_time.us_per_check[a] == cost["results"][case]["usec_per_check"]
    log = cost["log_storages"][algorithms.SLIDING_LOG.storage]["case"]
    assert capacity.bench_case("log", cost["log_storages"]) == f"{log} 10k keys"
    assert "make bench" in server_time.source and server_time.date
    # The default log is the compact one, measured as the plain class name.
    default = cost["log_storages"][algorithms.DEFAULT_LOG_STORAGE]["case"]
    assert capacity.bench_case("logc", cost["log_storages"]) == f"{default} 10k keys"


def test_the_plans_read_each_log_from_its_own_rows(table):
    full = capacity.Scenario.every_key_full("full", 1, 1_000, 3_600)
    compact = capacity.bytes_per_key(table, "log", 1_000, member_format="compact")
    assert planning.bytes_per_key(table, "logc", full, 1_000, 3_600) == compact
    assert planning.bytes_per_key(table, "log", full, 1_000, 3_600) == capacity.bytes_per_key(
        table, "log", 1_000
    )
    sizes = planning.key_bytes(table, [10, 1_000])
    assert list(sizes.index) == LABELS
    assert sizes.loc["sliding log (compact)", "limit 1,000"] == round(compact)


def test_scenarios_derive_memory_and_checks_from_one_traffic(chapter_plans, server_time):
    named, plans = chapter_plans
    assert list(named) == [planning.STEADY, planning.FULL]
    full, steady = named[planning.FULL], named[planning.STEADY]
    assert full.checks_per_second() == pytest.approx(1e6 * 1_000 / 3_600)
    assert full.mean_log_members(1_000, 3_600) == 1_000
    assert steady.mean_log_members(1_000, 3_600) == pytest.approx(180)
    # Within a scenario, the same checks for every algorithm; the shards for checks
    # follow the bench's server time with half of each shard kept free.
    for (name, a), plan in plans.items():
        assert plan.checks_per_s == pytest.approx(named[name].checks_per_second())
        usable = 1e6 / server_time.us_per_check[a] * 0.5
        assert plan.shards_for_checks == math.ceil(round(plan.checks_per_s / usable, 9))
    # Every key full: the O(1) algorithms are sized by their checks; the log by the larger
    # of its checks and its memory, which the findings name.
    full_shards = planning.shards_by_algorithm(plans, planning.FULL)
    o1 = ("fw", "swc", "gcra")
    assert all(plans[(planning.FULL, a)].shards_for_checks == full_shards[a] for a in o1)
    assert min(full_shards[a] for a in o1) > 2
    # The compact log weighs less and checks faster than the sorted set: never more shards.
    assert full_shards["logc"] < full_shards["log"]
    log = plans[(planning.FULL, "log")]
    assert full_shards["log"] == max(log.shards_for_checks, log.shards_for_memory)
    found = dict(
        (n, v) for n, v, _, _ in planning.findings(plans, named, server_time, 1_000, 3_600)
    )
    bound = {True: "its checks", False: "its memory"}[log.shards_for_checks > log.shards_for_memory]
    if log.shards_for_checks == log.shards_for_memory:
        bound = "checks and memory alike"
    assert found["full_log_bound"] == bound
    assert found["full_log_check_shards"] == log.shards_for_checks


def test_plan_table_and_policy_sweep(chapter_plans, table, server_time):
    _, plans = chapter_plans
    plan_table = planning.plan_table(plans)
    assert list(plan_table.index.get_level_values("scenario").unique()) == [
        planning.STEADY,
        planning.FULL,
    ]
    full_log = plans[(planning.FULL, "log")]
    assert plan_table.loc[
        (planning.FULL, "sliding log (sorted set)"), "memory"
    ] == memory.format_bytes(full_log.memory_bytes)
    assert list(plan_table.loc[planning.FULL].index) == LABELS
    sweep = planning.policy_sweep(table, 10**6, 0.05, server_time)
    assert list(sweep.index) == list(planning.POLICY_SWEEP)
    assert sweep[f"{planning.STEADY}: checks/s"].nunique() == 1
    assert sweep[f"{planning.FULL}: checks/s"].is_monotonic_decreasing
    for a in ("logc", "log", "swc"):
        assert planning.sweep_column(planning.FULL, a) in sweep.columns


def test_span():
    assert planning.span([3, 3, 3]) == "3"
    assert planning.span([17, 15, 16]) == "15-17"
    assert planning.span([26.55, 29.18], ".1f") == "26.6-29.2"


def test_default_figure_shows_both_scenarios_and_the_plans(table, chapter_plans, server_time):
    named, plans = chapter_plans
    fig = planning.figure(table=table, server_time=server_time)
    assert len(fig.axes) == 2
    for panel, name in enumerate(named):
        labels = [label for label, _, _ in steps(fig, panel)]
        shards = planning.shards_by_algorithm(plans, name)
        assert labels == [f"{LABELS[i]}: {n:,} shards" for i, n in enumerate(shards.values())]
        assert fig.axes[panel].get_title().startswith(name)
    assert "server time per check (us)" in fig._suptitle.get_text()


def test_legends_are_the_plans_shards(table, chapter_plans, server_time):
    named, plans = chapter_plans
    fig = planning.figure(table=table, server_time=server_time)
    assert planning.legends(fig) == planning.expected_legends(plans, named)
    assert planning.shards_label("gcra", 1) == "GCRA (token bucket): 1 shard"
    assert planning.shards_label("log", 1_200) == "sliding log (sorted set): 1,200 shards"


def test_figure_reads_the_stored_table_and_the_bench_record(table, server_time, monkeypatch):
    monkeypatch.chdir(NOTEBOOKS)
    fig, ref = planning.figure(), planning.figure(table=table, server_time=server_time)
    assert [lbl for lbl, _, _ in steps(fig, 1)] == [lbl for lbl, _, _ in steps(ref, 1)]


@pytest.mark.parametrize(
    "change",
    [{"limit": 100}, {"rate_per_key": 0.5}, {"headroom": 0.2}, {"peak_factor": 3}],
)
def test_a_parameter_changes_the_plotted_data(table, server_time, change):
    old = planning.figure(table=table, server_time=server_time)
    new = planning.figure(table=table, server_time=server_time, **change)
    changed = [
        not np.array_equal(a[2], b[2])
        for panel in (0, 1)
        for a, b in zip(steps(old, panel), steps(new, panel), strict=True)
    ]
    assert any(changed)


def test_figure_rejects_bad_input(table, server_time):
    with pytest.raises(ValueError):
        planning.figure(table=table, server_time=server_time, headroom=1.0)
    with pytest.raises(ValueError):
        planning.figure(table=table, server_time=server_time, rate_per_key=-1)


def test_sliders_build_and_redraw_from_the_chapters_parameters(table, server_time):
    calls = []
    chapter_figure = functools.partial(
        planning.figure, table=table, server_time=server_time, headroom=0.4
    )

    @functools.wraps(chapter_figure)
    def draw(**values):
        calls.append(values)
        return chapter_figure(**values)

    sliders = {
        "active_keys": ipywidgets.FloatLogSlider(value=1e6, base=10, min=3, max=8, step=0.1),
        "rate_per_key": ipywidgets.FloatLogSlider(value=0.05, base=10, min=-3, max=1, step=0.1),
        "limit": ipywidgets.FloatLogSlider(value=1_000, base=10, min=0, max=5, step=0.1),
        "headroom": (0.0, 0.9, 0.05),
    }
    widget = explorer(draw, **sliders)
    assert len(calls) == 1 and calls[0]["headroom"] == 0.4  # the partial's value, not 0.5
    assert [c.description for c in widget.children[:4]] == list(sliders)
    widget.children[2].value = 100.0
    assert len(calls) == 2 and calls[-1]["limit"] == 100.0


def test_chapter_templates_quote_only_recorded_names(table, chapter_plans, server_time):
    named, plans = chapter_plans
    found = {name for name, _, _, _ in planning.findings(plans, named, server_time, 1_000, 3_600)}
    for template in (planning.SUMMARY, planning.HEADLINE):
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f}
        assert fields and fields <= found
    assert planning.TITLE == "Capacity planning"
