"""Which lines are late, and the order every line reaches the replay, depend on the
file's content alone: not on the block size, the chunk size or gzip.

The expected order comes from a line-by-line model of the documented rule, written
here; the reader must agree with it, and with itself however the file is cut and however
far a thread reads ahead.
"""

from __future__ import annotations

import gzip
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratelimit.lab import planner
from ratelimit.lab.accesslog import LogReader, blocks

from .test_accesslog import clf_time, network

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
HOSTS = ["192.0.2.1", "192.0.2.2", "2001:db8::5"]


def released(times_ms: list[int], horizon_ms: int) -> tuple[list[int], list[int]]:
    """The documented rule, line by line: (indices in release order, late indices)."""
    held: list[int] = []
    out: list[int] = []
    late: list[int] = []
    newest = None
    for j, t in enumerate(times_ms):
        if newest is not None and t < newest - horizon_ms:
            late.append(j)
        newest = t if newest is None else max(newest, t)
        held.append(j)
        ready = sorted(
            (i for i in held if times_ms[i] <= newest - horizon_ms), key=lambda i: (times_ms[i], i)
        )
        out += ready
        held = [i for i in held if i not in ready]
    return out + sorted(held, key=lambda i: (times_ms[i], i)), late


# Lines: a time (ms after START, mostly rising, now and then far back), a client, and
# now and then a bad line between them.
line_specs = st.lists(
    st.tuples(
        st.integers(-120_000, 4_000),  # the step from the line before, in ms
        st.integers(0, len(HOSTS) - 1),
        st.integers(0, 9).map(lambda k: k == 0),  # a junk line after this one
    ),
    min_size=1,
    max_size=60,
)


def write_log(path, specs, gz: bool) -> tuple[list[int], list[str]]:
    """The log of `specs`; its requests' times (ms after START) and hosts."""
    lines, times, hosts, t = [], [], [], 600_000
    for step, host, junk in specs:
        t = max(0, t + step)
        stamp = clf_time(START + timedelta(milliseconds=t), 60, fraction=f".{t % 1000:03d}")
        lines.append(f'{HOSTS[host]} - - [{stamp}] "GET /x HTTP/1.1" 200 5 "-" "agent/{host}"')
        times.append(t)
        hosts.append(HOSTS[host])
        if junk:
            lines.append("a line that is not a request")
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return times, hosts


def read_with(path, block_bytes: int, chunk_lines: int, reorder_s: float, read_ahead: int = 1):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(blocks, "BLOCK_BYTES", block_bytes)
        reader = LogReader(
            path,
            chunk_lines=chunk_lines,
            reorder_s=reorder_s,
            fields=("agent",),
            read_ahead=read_ahead,
        )
        chunks = list(reader)
    return chunks, reader.problems


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(specs=line_specs, reorder_s=st.sampled_from([0.0, 1.0, 30.0]))
def test_late_lines_and_order_do_not_depend_on_how_the_log_is_read(tmp_path, specs, reorder_s):
    plain, packed = tmp_path / "access.log", tmp_path / "access.log.gz"
    times, hosts = write_log(plain, specs, gz=False)
    write_log(packed, specs, gz=True)
    order, late = released(times, round(reorder_s * 1000))
    start_s = START.timestamp()
    expected_time = [start_s + times[i] / 1000 for i in order]
    expected_host = [network(hosts[i]) for i in order]
    first = None
    for path in (plain, packed):
        for block_bytes in (64, 333, blocks.BLOCK_BYTES):
            for chunk_lines, read_ahead in ((1, 2), (4, 0), (10**6, 1)):
                chunks, problems = read_with(path, block_bytes, chunk_lines, reorder_s, read_ahead)
                assert all(0 < len(c) <= chunk_lines for c in chunks)
                assert all(c["time"].is_monotonic_increasing for c in chunks)  # the replay's need
                trace = pd.concat(chunks, ignore_index=True)
                assert trace["time"].tolist() == pytest.approx(expected_time, abs=1e-6)
                assert trace["identity"].tolist() == expected_host
                assert problems.late == len(late)
                if first is None:
                    first = (trace, problems)
                pd.testing.assert_frame_equal(trace, first[0])
                assert problems == first[1]


@settings(max_examples=6, deadline=None)
@given(specs=line_specs)
def test_the_plan_does_not_depend_on_how_the_log_is_read(tmp_path_factory, specs):
    folder = tmp_path_factory.mktemp("plan")
    path = folder / "access.log"
    write_log(path, specs, gz=False)
    plans = []
    ways = ((64, 1, 0), (333, 3, 2), (blocks.BLOCK_BYTES, 10**6, 1))
    for block_bytes, chunk_lines, read_ahead in ways:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(blocks, "BLOCK_BYTES", block_bytes)
            plan = planner.plan_log(
                path,
                ["2/s", "5/min"],
                ["log", "fw"],
                measure=False,
                chunk_lines=chunk_lines,
                reorder_s=1.0,
                read_ahead=read_ahead,
            )
        plans.append(plan.to_dict())
    assert plans[0] == plans[1] == plans[2]


@settings(max_examples=400, deadline=None)
@given(
    ascending=st.lists(st.integers(-5, 40), max_size=50),
    values=st.lists(st.integers(-8, 45), max_size=50),
    mostly_up=st.booleans(),
)
def test_first_reaching_is_searchsorted_for_values_in_any_order(ascending, values, mostly_up):
    a = np.sort(np.array(ascending, dtype=np.int64))
    v = np.array(sorted(values) if mostly_up else values, dtype=np.int64)
    got = blocks.first_reaching(a, v)
    assert got.tolist() == np.searchsorted(a, v, side="left").tolist()


@settings(max_examples=400, deadline=None)
@given(
    steps=st.lists(
        st.one_of(st.just(0), st.integers(0, 3_000), st.integers(-400_000, -1)),
        min_size=1,
        max_size=80,
    ),
    cuts=st.lists(st.integers(1, 80), max_size=6),
    horizon_ms=st.sampled_from([0, 1, 1_000, 300_000]),
)
def test_the_reorder_buffer_releases_as_the_rule_says_block_by_block(steps, cuts, horizon_ms):
    # Runs that never go back take the buffer's quick way (a prefix released); a step
    # back takes the general one; the order must be the rule's either way.
    times = np.cumsum(np.array(steps, dtype=np.int64))
    order = blocks._Reorder(horizon_ms * 1_000_000)
    out: list[int] = []
    bounds = [0, *sorted({c for c in cuts if c < len(times)}), len(times)]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        index = np.arange(lo, hi, dtype=np.int64)
        rows = blocks._Rows(index, times[lo:hi] * 1_000_000, index, index, np.empty((hi - lo, 0)))
        out += order.push(rows).line.tolist()
        assert order.held == hi - len(out)
    out += order.flush().line.tolist()
    assert out == released(times.tolist(), horizon_ms)[0]
