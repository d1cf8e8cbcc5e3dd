"""Chapter 3's module: measuring (or the stored table), the chapter's tables and figures
from that table, the two storages of the exact log, the leak experiment, and the Explore
figure."""

from __future__ import annotations

import json
from pathlib import Path

import fakeredis
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import redis  # noqa: E402

from ratelimit import algorithms  # noqa: E402
from ratelimit.lab import memory  # noqa: E402
from ratelimit.lab.chapters import memory_per_key  # noqa: E402
from ratelimit.lab.plotting import explorer  # noqa: E402

STORED = memory_per_key.STORED_TABLE


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return memory.load_table(STORED)


def bar_heights(fig):
    return [round(p.get_height()) for p in fig.axes[0].patches]


# --- series and limits ------------------------------------------------------------------


def test_series_follow_the_registry():
    assert list(memory_per_key.SERIES) == [
        ("log", "script"),
        ("log", "classic"),
        ("log", "compact"),
        *[(name, "") for name in algorithms.NAMES if name != "log"],
    ]
    assert memory_per_key.SERIES["log", "script"] == "sliding log, our members"
    assert memory_per_key.SERIES["log", "classic"] == "sliding log, classic members"
    assert memory_per_key.SERIES["log", "compact"] == "sliding log, compact"
    # Each storage of the limiter, and the table's name for its keys.
    assert set(memory_per_key.STORAGES) == set(algorithms.LOG_STORAGES)
    assert memory_per_key.STORAGES == {"sorted-set": "script", "compact": "compact"}
    assert memory_per_key.SERIES["gcra", ""] == algorithms.get("gcra").label
    assert memory_per_key.O1 == ["fw", "swc", "gcra"]


def test_limits_to_measure_cover_the_sweep_the_threshold_and_the_extras():
    limits = memory_per_key.limits_to_measure(128, max_limit=1_000, points_per_decade=1, extra=[7])
    assert limits == sorted(set(limits))
    assert {1, 10, 100, 1_000, 7, 64, 128, 129, 256} <= set(limits)
    assert set(range(8, 257, 8)) <= set(limits)
    assert max(limits) == 1_000
    assert len(memory_per_key.limits_to_measure(128)) > len(limits)  # the chapter's sweep
    with pytest.raises(ValueError):
        memory_per_key.limits_to_measure(128, max_limit=0)


def test_series_is_indexed_by_limit_and_refuses_unknown_series(table):
    ours = memory_per_key.series(table, "log", "script")
    assert ours.index.is_monotonic_increasing and ours.index.name == "limit"
    assert (ours.algorithm == "log").all() and (ours.member_format == "script").all()
    with pytest.raises(ValueError, match="no series"):
        memory_per_key.series(table, "log")


# --- measuring --------------------------------------------------------------------------


def test_measure_falls_back_to_the_stored_table_and_never_writes_it():
    before = STORED.stat().st_mtime_ns
    result = memory_per_key.measure(fakeredis.FakeRedis(), STORED, save=True)
    assert result.source == "stored" and result.saved_to is None
    assert "fakeredis" in result.reason
    assert result.table.equals(memory.load_table(STORED))
    assert STORED.stat().st_mtime_ns == before
    report = result.report("the embedded fakeredis").splitlines()
    assert report[0].startswith("Cannot measure here: memory is not measurable")
    assert report[1] == f"Showing the stored table, measured on Redis {result.version}."
    assert report[2] == f"zset-max-listpack-entries: {result.threshold}"


def test_measure_on_a_real_redis_saves_only_when_asked(real_redis_url, tmp_path, monkeypatch):
    client = redis.Redis.from_url(real_redis_url, socket_timeout=10)
    path = tmp_path / "memory.csv"
    small = {"max_limit": 10, "points_per_decade": 1, "extra_limits": []}
    try:
        monkeypatch.setenv("RATELIMIT_SAVE_MEASUREMENTS", "0")
        unsaved = memory_per_key.measure(client, path, **small)
        assert unsaved.source == "measured" and unsaved.saved_to is None and not path.exists()
        saved = memory_per_key.measure(client, path, save=True, **small)
    finally:
        client.close()
    assert saved.saved_to == path and memory.load_table(path).equals(saved.table)
    expected = memory_per_key.limits_to_measure(
        saved.threshold, max_limit=10, points_per_decade=1, extra=[]
    )
    assert sorted(set(saved.table.limit)) == expected
    assert len(saved.table) == len(expected) * len(memory_per_key.SERIES)
    report = saved.report("a test Redis").splitlines()
    assert report[0] == f"Measured {len(saved.table)} keys on a test Redis (Redis {saved.version})."
    assert report[1] == f"Saved to {path}."


# --- tables -----------------------------------------------------------------------------


def test_headline_table_adds_the_threshold_and_one_above(table):
    summary = memory_per_key.headline_table(table, [10, 1_000])
    assert summary.index.tolist() == [10, 128, 129, 1_000] and summary.index.name == "limit"
    ours = memory_per_key.series(table, "log", "script")
    assert (
        summary["ours: bytes per key"].tolist()
        == ours.bytes_per_key[[10, 128, 129, 1_000]].tolist()
    )
    assert summary.encoding.tolist() == ["listpack", "listpack", "skiplist", "skiplist"]
    # Bytes per member as the README quotes them: one decimal, from the same row.
    expected = [format(v, ".1f") for v in ours.bytes_per_entry[[10, 128, 129, 1_000]]]
    assert summary["ours: bytes per member"].tolist() == expected


def test_encodings_table_changes_at_the_threshold(table):
    encodings = memory_per_key.encodings_table(table)
    assert encodings.index.tolist() == [
        "half the threshold",
        "at the threshold",
        "one above",
        "twice the threshold",
    ]
    assert encodings.ours.tolist() == ["listpack", "listpack", "skiplist", "skiplist"]
    assert encodings.classic.tolist() == encodings.ours.tolist()


def test_storage_table_puts_the_two_storages_side_by_side(table):
    storages = memory_per_key.storage_table(table, [10, 128, 1_000])
    assert storages.index.tolist() == [10, 128, 1_000] and storages.index.name == "entries"
    sorted_set = memory_per_key.series(table, "log", "script")
    compact = memory_per_key.series(table, "log", "compact")
    rows = [10, 128, 1_000]
    assert storages["sorted set: bytes per unit"].tolist() == [
        format(v, ".1f") for v in sorted_set.bytes_per_entry[rows]
    ]
    assert storages["compact: bytes per unit"].tolist() == [
        format(v, ".1f") for v in compact.bytes_per_entry[rows]
    ]
    ratio = sorted_set.bytes_per_entry[rows] / compact.bytes_per_entry[rows]
    assert storages["sorted set / compact"].tolist() == [format(v, ".1f") for v in ratio]
    assert (storages["compact: encoding"] == "hashtable").all()


def test_the_stored_compact_log_is_small_from_128_entries_up(table):
    """What chapter 3 asserts, on the committed table."""
    compact = memory_per_key.series(table, "log", "compact").bytes_per_entry
    sorted_set = memory_per_key.series(table, "log", "script")
    assert (compact[compact.index >= 128] <= 12).all()
    skiplist = sorted_set.index[sorted_set.encoding == "skiplist"]
    assert (sorted_set.bytes_per_entry[skiplist] > 10 * compact[skiplist]).all()


def test_o1_table_has_one_row_per_o1_algorithm(table):
    o1 = memory_per_key.o1_table(table, [1, 1_000])
    assert o1.index.tolist() == [algorithms.get(a).label for a in memory_per_key.O1]
    assert o1.columns.tolist() == ["encoding", "bytes at limit 1", "bytes at limit 1,000"]
    gcra = memory_per_key.series(table, "gcra")
    assert o1.loc["GCRA (token bucket)", "bytes at limit 1,000"] == gcra.bytes_per_key[1_000]


def test_fleet_table_formats_every_series_and_fleet(table):
    fleet = memory.fleet_memory(table, [10**3, 10**6], [10, 1_000])
    wide = memory_per_key.fleet_table(fleet)
    assert wide.columns.tolist() == ["1,000 keys", "1,000,000 keys"]
    assert wide.index.names == ["series", "limit"]
    assert list(dict.fromkeys(wide.index.get_level_values(0))) == list(
        memory_per_key.SERIES.values()
    )
    gcra = fleet[(fleet.algorithm == "gcra") & (fleet.limit == 10) & (fleet.active_keys == 10**6)]
    expected = memory.format_bytes(int(gcra.total_bytes.iloc[0]))
    assert wide.loc[("GCRA (token bucket)", 10), "1,000,000 keys"] == expected


# --- figures ----------------------------------------------------------------------------


def test_key_size_figure_plots_every_series(table):
    fig = memory_per_key.key_size_figure(table)
    try:
        (ax,) = fig.axes
        lines = ax.get_lines()[: len(memory_per_key.SERIES)]
        for line, (algorithm, member_format) in zip(lines, memory_per_key.SERIES, strict=True):
            rows = memory_per_key.series(table, algorithm, member_format)
            assert np.array_equal(line.get_ydata(), rows.bytes_per_key)
        assert ax.get_xscale() == ax.get_yscale() == "log"
        assert "7.0.15" in ax.get_title() and ax.get_ylabel()
    finally:
        plt.close(fig)


def test_threshold_figure_stops_at_twice_the_threshold(table):
    fig = memory_per_key.threshold_figure(table)
    try:
        (ax,) = fig.axes
        ours, classic = ax.get_lines()[:2]
        assert max(ours.get_xdata()) == 256 and max(classic.get_xdata()) == 256
        expected = memory_per_key.series(table, "log", "script").bytes_per_entry.loc[:256]
        assert np.allclose(ours.get_ydata(), expected)
    finally:
        plt.close(fig)


def test_member_format_figure_shows_bytes_per_member(table):
    fig = memory_per_key.member_format_figure(table, [10, 129])
    try:
        (ax,) = fig.axes
        ours, classic = ax.containers
        expected = memory_per_key.series(table, "log", "classic").bytes_per_entry[[10, 129]]
        assert np.allclose([b.get_height() for b in classic], expected)
        assert [t.get_text() for t in ax.get_xticklabels()] == ["10", "129"]
        assert len(ours) == 2
    finally:
        plt.close(fig)


def test_storage_figure_plots_bytes_per_unit_of_each_storage(table):
    fig = memory_per_key.storage_figure(table)
    try:
        (ax,) = fig.axes
        lines = {line.get_label(): line for line in ax.get_lines()}
        for member_format in ("script", "classic", "compact"):
            line = lines[memory_per_key.SERIES["log", member_format]]
            rows = memory_per_key.series(table, "log", member_format)
            assert np.array_equal(line.get_xdata(), rows.index)
            assert np.allclose(line.get_ydata(), rows.bytes_per_entry)
        assert ax.get_xscale() == ax.get_yscale() == "log"
        assert "unit" in ax.get_ylabel() and "7.0.15" in ax.get_title()
    finally:
        plt.close(fig)


def test_compare_trace_has_a_bursty_client_and_costly_look_ups():
    trace = memory_per_key.compare_trace(seconds=4.0)
    assert set(trace.identity) == {"bursty", "geofence"}
    assert trace.time.is_monotonic_increasing and trace.time.max() < 4.0
    assert trace[trace.identity == "bursty"].cost.eq(1).all()
    assert trace[trace.identity == "geofence"].cost.max() > 1
    assert trace.equals(memory_per_key.compare_trace(seconds=4.0))  # seeded


def test_both_storages_decide_alike_and_leave_nothing_behind():
    client = fakeredis.FakeRedis()
    trace = memory_per_key.compare_trace(seconds=4.0)
    decided, summary = memory_per_key.same_decisions(client, trace, limit=100)
    assert summary.index.tolist() == ["sorted-set", "compact", "reference model"]
    assert (summary.requests == len(trace)).all()
    assert (summary["differ from the sorted set"] == 0).all()
    assert (summary.admitted + summary.rejected == summary.requests).all()
    assert 0 < summary.loc["compact", "rejected"] < len(trace)
    assert decided["compact"].equals(decided["sorted-set"])
    assert decided["compact"].columns.tolist() == ["allowed", "remaining", "retry_after_ms"]
    assert client.dbsize() == 0


def test_a_different_decision_would_be_counted(monkeypatch):
    """`same_decisions` compares every field: a compact limiter that answered with one
    unit less remaining would show up in the summary."""
    client = fakeredis.FakeRedis()
    trace = memory_per_key.compare_trace(seconds=1.0)
    from ratelimit.lab import simulation

    real = simulation.replay

    def skewed(traffic, limiter, **kwargs):
        out = real(traffic, limiter, **kwargs)
        if getattr(limiter, "storage", None) == "compact" and hasattr(limiter, "redis"):
            out.loc[out.index[0], "remaining"] -= 1
        return out

    monkeypatch.setattr(simulation, "replay", skewed)
    _, summary = memory_per_key.same_decisions(client, trace, limit=100)
    assert summary["differ from the sorted set"].tolist() == [0, 1, 0]


# --- the leak ---------------------------------------------------------------------------


def test_leak_counts_both_recipes_and_deletes_its_keys():
    client = fakeredis.FakeRedis()
    # A long window and no wait: one sample, taken before anything can expire.
    result = memory_per_key.leak(client, 20, window_ms=60_000, wait_s=0)
    assert result.samples.columns.tolist() == ["ms", "classic", "ours"]
    assert len(result.samples) == 1
    assert result.samples[["classic", "ours"]].iloc[0].tolist() == [20, 20]
    table = result.table
    assert table.index.tolist() == ["classic, EXPIRE forgotten", "ours"]
    assert table["keys written"].tolist() == [20, 20]
    assert table["keys left after 0 s"].tolist() == [20, 20]
    assert table.TTL.tolist() == ["none", "60000 ms after each request"]
    assert result.cleaned_up and client.dbsize() == 0


def test_leak_refuses_bad_arguments():
    with pytest.raises(ValueError):
        memory_per_key.leak(fakeredis.FakeRedis(), 0)
    with pytest.raises(ValueError):
        memory_per_key.leak(fakeredis.FakeRedis(), 5, wait_s=-1)


def test_leak_figure_shows_the_samples():
    samples = pd.DataFrame({"ms": [0.0, 100.0, 250.0], "classic": [5, 5, 5], "ours": [5, 5, 0]})
    fig = memory_per_key.leak_figure(samples, clients=5, window_ms=200)
    try:
        (ax,) = fig.axes
        classic, ours = ax.get_lines()[:2]
        assert list(classic.get_ydata()) == [5, 5, 5] and list(ours.get_ydata()) == [5, 5, 0]
        assert "5 one-shot clients" in ax.get_title()
    finally:
        plt.close(fig)


# --- Explore ----------------------------------------------------------------------------


def test_default_figure_is_labelled_and_shows_the_stored_fleet(table):
    fig = memory_per_key.figure()
    try:
        (ax,) = fig.axes
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
        assert "bytes" in ax.get_ylabel()
        assert ax.get_legend() is not None
        fleet = memory.fleet_memory(table, [10**7], [1_000])
        assert bar_heights(fig) == fleet.total_bytes.tolist()  # SERIES follows table order
        labels = [t.get_text() for t in ax.get_xticklabels()]
        assert labels == [
            "sliding log,\nour members",
            "sliding log,\nclassic members",
            "sliding log,\ncompact",
            "fixed window",
            "sliding-window\ncounter",
            "GCRA\n(token bucket)",
        ]
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend == [
            "sliding log, sorted set: grows with the limit",
            "sliding log, compact: grows with the limit",
            "O(1): the same at every limit",
        ]
    finally:
        plt.close(fig)


def test_headline_prints_the_stored_figures(table):
    text = memory_per_key.headline(table).splitlines()
    fleet = memory.fleet_memory(table, [10**7], [1_000])
    assert text[0] == "10,000,000 active keys, each full at limit 1,000 (Redis 7.0.15):"
    assert len(text) == 1 + len(memory_per_key.SERIES) + 1 + len(memory_per_key.STORAGES)
    compact = fleet[fleet.member_format == "compact"].total_bytes.iloc[0]
    assert f"  sliding log, compact: {memory.format_bytes(int(compact))}" in text
    per_unit = memory_per_key.series(table, "log", "compact").bytes_per_entry
    assert text[-1] == "  compact: " + ", ".join(
        f"{per_unit[n]:.1f}" for n in (128, 1_000, 100_000)
    )


def test_parameters_change_the_bars():
    default = memory_per_key.figure()
    fewer = memory_per_key.figure(active_keys=10**4)
    lower = memory_per_key.figure(limit=129)
    try:
        ten_million, ten_thousand = bar_heights(default), bar_heights(fewer)
        assert ten_thousand != ten_million
        assert [h * 1_000 for h in ten_thousand] == ten_million
        # A lower limit shrinks the sliding log only (its three bars); the O(1) bars stay.
        at_129 = bar_heights(lower)
        assert all(a != b for a, b in zip(at_129[:3], ten_million[:3], strict=True))
        assert at_129[3:] == ten_million[3:]
    finally:
        for fig in (default, fewer, lower):
            plt.close(fig)


def test_table_argument_and_unknown_limit(table):
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


# --- the numbers the chapter quotes -----------------------------------------------------

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOK = NOTEBOOKS / "03_memory_per_key.ipynb"
RECORDS = NOTEBOOKS / "data" / "records" / "03_memory_per_key.json"


def _texts(table) -> dict[str, str]:
    return {q.name: format(q.value, q.fmt) for q in memory_per_key.quotes(table)}


def test_quotes_come_from_the_rows_the_tables_and_figure_show(table):
    texts = _texts(table)
    assert texts["redis_version"] == memory_per_key.table_version(table)
    assert texts["listpack_threshold"] == str(int(table.listpack_threshold.iloc[0]))
    # Bytes per member: the same text as the chapter's table, row for row.
    summary = memory_per_key.headline_table(table)
    threshold = int(table.listpack_threshold.iloc[0])
    for role, n in {"small": 10, "threshold": threshold, "above": threshold + 1}.items():
        assert texts[f"ours_per_member_{role}"] == summary.loc[n, "ours: bytes per member"]
        assert texts[f"classic_per_member_{role}"] == summary.loc[n, "classic: bytes per member"]
        assert texts[f"encoding_{role}"] == summary.loc[n, "encoding"]
    storages = memory_per_key.storage_table(table, [threshold, 1_000])
    assert texts["compact_per_unit_fleet"] == storages.loc[1_000, "compact: bytes per unit"]
    # The fleet: the same text as the Explore figure's bar labels.
    fig = memory_per_key.figure(table=table)
    try:
        labels = [t.get_text() for t in fig.axes[0].texts]
    finally:
        plt.close(fig)
    assert labels[:3] == [texts["fleet_ours"], texts["fleet_classic"], texts["fleet_compact"]]
    assert {texts["fleet_o1_min"], texts["fleet_o1_max"]} <= set(labels[3:])


def test_quotes_follow_the_table_they_are_given(table):
    """A table measured elsewhere quotes its own numbers: nothing is fixed in the code."""
    doubled = table.assign(
        bytes_per_key=table.bytes_per_key * 2,
        bytes_per_entry=table.bytes_per_entry * 2,
        redis_version="8.0.1",
    )
    before, after = _texts(table), _texts(doubled)
    assert after["redis_version"] == "8.0.1"
    ours = memory_per_key.series(table, "log", "script").bytes_per_entry
    assert after["ours_per_member_fleet"] == f"{2 * ours[1_000]:.1f}"
    assert after["ours_per_member_fleet"] != before["ours_per_member_fleet"]
    assert after["fleet_ours"] != before["fleet_ours"]
    assert after["step_factor"] == before["step_factor"]  # a ratio


def test_the_skiplist_range_is_the_measured_one(table):
    texts = _texts(table)
    ours = memory_per_key.series(table, "log", "script").bytes_per_entry
    big = ours[ours.index >= 2 * int(table.listpack_threshold.iloc[0])]
    assert texts["skiplist_min_per_member"] == f"{big.min():.1f}"
    assert texts["skiplist_max_per_member"] == f"{big.max():.1f}"
    # The old README said "under 100 bytes each" from a few hundred entries on.
    assert big.max() > 100


def test_a_table_of_two_versions_is_refused(table):
    mixed = table.assign(redis_version=["7.0.15"] * (len(table) - 1) + ["7.2.4"])
    with pytest.raises(ValueError, match="mixes Redis versions"):
        memory_per_key.quotes(mixed)


def test_readme_templates_quote_only_records(table):
    """Every field of the README's parts is a record: `quotes`, plus section 5's
    `compare_requests` (recorded by the notebook)."""
    import string

    fields = set()
    templates = [memory_per_key.SUMMARY, memory_per_key.HEADLINE]
    templates += list(memory_per_key.README_BLOCKS.values())
    for template in templates:
        fields |= {f for _, f, _, _ in string.Formatter().parse(template) if f}
    assert fields - set(_texts(table)) == {"compare_requests"}
    assert set(memory_per_key.README_BLOCKS) == {"member-sizes", "compact-sizes"}


def test_the_committed_records_are_the_stored_tables(table):
    """`make refresh` records what `quotes` says of the stored table, and the README
    blocks render from them."""
    from ratelimit.lab import records

    committed = json.loads(RECORDS.read_text())
    assert committed["run"]["backend"].startswith(f"Redis {memory_per_key.table_version(table)}")
    values = committed["values"]
    assert {n: values[n]["text"] for n in _texts(table)} == _texts(table)
    where = "memory_per_key"
    for marker, template in memory_per_key.README_BLOCKS.items():
        block = records.fill(template, values, where)
        assert "{" not in block.replace("storage=", ""), marker
    member_sizes = records.fill(memory_per_key.README_BLOCKS["member-sizes"], values, where)
    assert f"| {values['above_threshold']['text']} | skiplist |" in member_sizes


def test_the_conclusion_quotes_only_recorded_numbers(table):
    """The conclusion is rendered from the records: its fields are records, and the only
    numbers typed into it are not measurements (the compact log's 6-byte entries in
    chunks of 63, 3-byte members, O(1), Redis versions, section numbers)."""
    import re
    import string

    template = memory_per_key.CONCLUSION
    fields = {f for _, f, _, _ in string.Formatter().parse(template) if f}
    assert fields and fields - set(_texts(table)) == set()
    literal = "".join(text for text, _, _, _ in string.Formatter().parse(template))
    typed = set(re.findall(r"\d+(?:\.\d+)*", literal))
    assert typed <= {"1", "3", "5", "6", "7.0", "8", "63"}, typed
    # The notebook renders it (rather than typing numbers into a Markdown cell).
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells]
    assert any("memory_per_key.CONCLUSION.format(" in source for source in sources)
