"""The requests a plan keeps (ratelimit.lab.planner.kept): in memory up to a bound, then
in a temporary file; the same blocks, replays and plans whichever way they were kept."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit import algorithms
from ratelimit.lab import planner
from ratelimit.lab.planner import kept, recommend, resolution
from tests.lab.test_planner import BENCH_CHOICE
from tests.lab.test_resolution import stamped_trace

chunk_sizes = st.lists(st.integers(0, 40), min_size=0, max_size=12)


def chunks_of(sizes: list[int], seed: int = 0):
    rng = np.random.default_rng(seed)
    return [
        (rng.integers(0, 9, n).astype(np.int32), rng.integers(0, 10**12, n), rng.integers(1, 5, n))
        for n in sizes
    ]


def joined(blocks) -> list[np.ndarray]:
    parts = list(zip(*blocks, strict=True)) or [(), (), ()]
    return [np.concatenate(p) if p else np.zeros(0) for p in parts]


@settings(max_examples=80, deadline=None)
@given(sizes=chunk_sizes, memory_rows=st.integers(1, 60))
def test_the_blocks_give_every_request_once_in_order(sizes, memory_rows):
    given_chunks = chunks_of(sizes)
    with kept.KeptTrace(memory_rows=memory_rows) as trace:
        for chunk in given_chunks:
            trace.add(*chunk)
        assert len(trace) == sum(sizes)
        assert trace.on_disk <= len(trace)
        assert trace.on_disk >= len(trace) - memory_rows + 1 or trace.on_disk == 0
        for _ in range(2):  # every replay reads the same requests again
            got = joined(trace.blocks())
            want = joined(given_chunks)
            for g, w in zip(got, want, strict=True):
                assert g.tolist() == w.tolist()
            assert [b[0].dtype for b in trace.blocks()] == [np.int32] * len(list(trace.blocks()))


def test_a_trace_past_its_bound_writes_the_rest_to_disk():
    trace = kept.KeptTrace(memory_rows=100)
    trace.add(*chunks_of([60])[0])
    assert trace.on_disk == 0
    trace.add(*chunks_of([50])[0])
    assert trace.on_disk == 110 and len(trace) == 110
    trace.add(*chunks_of([7])[0])
    assert trace.on_disk == 110 and len(trace) == 117
    assert [len(b[0]) for b in trace.blocks()] == [110, 7]


def test_a_kept_chunk_is_a_copy():
    codes, times, costs = (np.arange(5, dtype=np.int32), np.arange(5) * 10, np.ones(5, np.int64))
    trace = kept.KeptTrace.in_memory(codes, times, costs)
    times[:] = -1
    assert next(trace.blocks())[1].tolist() == [0, 10, 20, 30, 40]


def test_closing_removes_the_file_and_the_requests():
    def open_files() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_files()
    trace = kept.KeptTrace(memory_rows=10)
    trace.add(*chunks_of([25])[0])
    assert open_files() == before + 1
    trace.close()
    assert open_files() == before and len(trace) == 0 and list(trace.blocks()) == []


def test_columns_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="same length"):
        kept.KeptTrace().add(np.zeros(3), np.zeros(3), np.zeros(2))
    with pytest.raises(ValueError, match="at least 1"):
        kept.KeptTrace(memory_rows=0)


@settings(max_examples=60, deadline=None)
@given(
    stamps=st.lists(st.integers(0, 8), min_size=0, max_size=80),
    cuts=st.lists(st.integers(0, 80), max_size=6),
    unit=st.sampled_from([10, 1_000]),
)
def test_spreading_block_by_block_equals_spreading_the_whole(stamps, cuts, unit):
    times = np.array(stamps, dtype=np.int64) * unit  # any order: late lines included
    blocks = np.split(times, sorted(c for c in cuts if c <= len(times)))
    counted = resolution.Stamps(blocks, unit)
    place = counted.spreading()
    got = np.concatenate([place(b) for b in blocks]) if blocks else times
    assert got.tolist() == resolution.spread(times, unit).tolist()


@pytest.mark.parametrize("name", algorithms.NAMES)
def test_a_replay_is_the_same_from_disk_as_from_memory(name):
    rng = np.random.default_rng(3)
    n = 5_000
    columns = (rng.integers(0, 30, n), np.sort(rng.integers(0, 60_000, n)) // 1000 * 1000,
               rng.choice([1, 1, 1, 2, 9], n))  # fmt: skip
    in_memory = kept.KeptTrace.in_memory(*columns)
    on_disk = kept.KeptTrace(memory_rows=333)
    for at in range(0, n, 700):
        on_disk.add(*(c[at : at + 700] for c in columns))
    assert on_disk.on_disk > 0
    for stamps in (None, "spread"):
        outcomes = []
        for trace in (in_memory, on_disk):
            counted = None
            if stamps:
                counted = resolution.Stamps((t for _, t, _ in trace.blocks()), 1_000)
            outcomes.append(recommend.replay(trace, name, 8, 5_000, 30, counted))
        a, b = outcomes
        assert (a.rejected, a.refused, a.identities_affected) == (
            b.rejected, b.refused, b.identities_affected)  # fmt: skip
        assert a.rejected_by_code.tolist() == b.rejected_by_code.tolist()
        assert a.rejected > 0 and a.refused > 0  # the case is not empty


@pytest.mark.parametrize("name", algorithms.NAMES)
def test_limits_replayed_together_are_each_replayed_alone(name):
    """`replay_many` decides every limit on every block in threads of their own; each
    limit's outcome must be the one it has replayed alone."""
    rng = np.random.default_rng(5)
    n = 6_000
    columns = (rng.integers(0, 40, n), np.sort(rng.integers(0, 90_000, n)),
               rng.choice([1, 1, 2, 7], n))  # fmt: skip
    trace = kept.KeptTrace(memory_rows=500)
    for at in range(0, n, 900):
        trace.add(*(c[at : at + 900] for c in columns))
    assert trace.on_disk > 0
    limits = [3, 5, 6, 12, 40]
    together = recommend.replay_many(trace, name, limits, 10_000, 40)
    assert sorted(together) == limits
    for limit in limits:
        alone = recommend.replay(trace, name, limit, 10_000, 40)
        got = together[limit]
        assert (got.limit, got.rejected, got.refused, got.identities_affected) == (
            alone.limit, alone.rejected, alone.refused, alone.identities_affected)  # fmt: skip
        assert got.rejected_by_code.tolist() == alone.rejected_by_code.tolist()
    assert together[3].rejected > together[40].rejected  # the limits differ in what they do


def test_a_plan_kept_on_disk_equals_the_plan_kept_in_memory(monkeypatch):
    """Whole-second stamps (spread for the 2 s window) and a recommendation: both replay
    the kept requests, here written out every 97 of them."""
    trace = stamped_trace(4, 1_000, n=3_000, identities=40)
    parts = [trace.iloc[at : at + 250] for at in range(0, len(trace), 250)]

    def plan() -> dict:
        return planner.plan_trace(
            iter(parts), ["3/2s", "30/min"], ["log", "gcra"], server_time=BENCH_CHOICE
        ).to_dict()

    in_memory = plan()
    files = []
    opened = tempfile.TemporaryFile

    def counting(*args, **kwargs):
        files.append(opened(*args, **kwargs))
        return files[-1]

    monkeypatch.setattr(kept, "MEMORY_ROWS", 97)
    monkeypatch.setattr(kept.tempfile, "TemporaryFile", counting)
    on_disk = plan()
    assert len(files) == 1 and files[0].closed  # written, and removed by the plan
    assert on_disk == in_memory
    assert any(c["stamps"] for c in in_memory["candidates"])  # the spread was replayed
    assert in_memory["recommended"]


def test_a_trace_in_memory_is_a_dataframe_plan_too():
    trace = pd.DataFrame({"time": [1.0, 1.5, 2.0], "identity": ["a", "a", "b"], "cost": [1, 1, 1]})
    plan = planner.plan_trace(trace, ["1/s"], ["log"], server_time=BENCH_CHOICE)
    assert plan.recommended[0].requests == 3


def test_a_full_disk_is_one_line_naming_tmpdir(monkeypatch):
    import contextlib
    import errno
    import io

    from ratelimit.lab.__main__ import main

    class Full(io.BytesIO):
        def write(self, data) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(kept, "MEMORY_ROWS", 1_000)
    monkeypatch.setattr(kept.tempfile, "TemporaryFile", lambda **_: Full())
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["plan", "--no-measure", "--no-progress", "--algorithm", "log"])
    assert code == 1
    lines = err.getvalue().strip().splitlines()
    assert "Traceback" not in err.getvalue()
    assert lines[0].startswith("No LOG given")  # the example log's note, then the error
    assert len(lines) == 2 and "No space left on device" in lines[1] and "TMPDIR" in lines[1]
    assert "--affect none --no-spread" in lines[1]
