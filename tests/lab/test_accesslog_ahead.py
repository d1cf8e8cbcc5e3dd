"""Reading ahead in a thread (`accesslog.ahead`) and identities as categories: the same
chunks, the same plan and the same codes as reading in turn with identities as text;
errors reach the caller, and a caller that stops early stops the reading."""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit.lab import planner
from ratelimit.lab.__main__ import main
from ratelimit.lab.accesslog import LogReader, blocks
from ratelimit.lab.accesslog.ahead import ahead
from ratelimit.lab.fastreplay import Codes

from .test_accesslog import clf

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def reading_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ratelimit-read-ahead"]


def open_paths() -> list[str]:
    """The files this process holds open (Linux)."""
    folder = Path("/proc/self/fd")
    if not folder.is_dir():
        pytest.skip("needs /proc to list open files")
    paths = []
    for fd in folder.iterdir():
        try:
            paths.append(os.readlink(fd))
        except OSError:
            continue
    return paths


def busy_log(tmp_path, n: int = 3000, seed: int = 5):
    """A clf log of `n` requests from 40 clients (IPv4, IPv6, names), a bad line now
    and then, and some lines a few seconds out of order."""
    rng = np.random.default_rng(seed)
    hosts = [f"198.51.100.{i}" for i in range(20)] + [f"2001:db8::{i:x}" for i in range(15)]
    hosts += [f"crawler-{i}.example.net" for i in range(5)]
    lines, t = [], 0
    for k in range(n):
        t += int(rng.integers(0, 400))
        when = START + timedelta(milliseconds=t - (4000 if k % 97 == 0 else 0))
        lines.append(clf(hosts[int(rng.integers(len(hosts)))], "-", when))
        if k % 250 == 0:
            lines.append("not a request at all")
    path = tmp_path / "access.log"
    path.write_text("\n".join(lines) + "\n")
    return path


# --- ahead() itself --------------------------------------------------------------------


def test_items_come_in_order_and_no_more_than_depth_wait():
    made: list[int] = []

    def items():
        for i in range(50):
            made.append(i)
            yield i

    got = []
    for item in ahead(items(), depth=3):
        time.sleep(0.001 if item % 7 else 0.02)  # a slow caller now and then
        # Made: those taken, up to `depth` waiting, and one in hand waiting for room.
        assert len(made) <= item + 1 + 3 + 1
        got.append(item)
    assert got == list(range(50)) and not reading_threads()


def test_an_error_while_reading_reaches_the_caller_where_the_item_would_be():
    def items():
        yield 1
        yield 2
        raise RuntimeError("the disk went away")

    got = []
    with pytest.raises(RuntimeError, match="the disk went away"):
        for item in ahead(items(), depth=2):
            got.append(item)
    assert got == [1, 2] and not reading_threads()


def test_a_caller_that_stops_early_stops_the_reading_and_its_clean_up_runs():
    cleaned = threading.Event()
    made: list[int] = []

    def items():
        try:
            for i in range(10**6):
                made.append(i)
                yield i
        finally:
            cleaned.set()

    stream = ahead(items(), depth=2)
    assert next(stream) == 0
    stream.close()
    assert cleaned.is_set() and not reading_threads()
    assert len(made) <= 4  # the one taken, two waiting, one in hand


def test_depth_zero_reads_in_the_callers_thread():
    seen = []

    def items():
        seen.append(threading.current_thread())
        yield 1

    assert list(ahead(items(), depth=0)) == [1]
    assert seen == [threading.current_thread()]


# --- the reader ------------------------------------------------------------------------


def test_read_ahead_gives_the_same_chunks_and_problems(tmp_path):
    path = busy_log(tmp_path)
    results = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(blocks, "BLOCK_BYTES", 4096)  # many blocks, many chunks
        for read_ahead in (0, 1, 4):
            reader = LogReader(path, chunk_lines=500, reorder_s=1.0, read_ahead=read_ahead)
            results.append((pd.concat(list(reader), ignore_index=True), reader.problems))
    first_trace, first_problems = results[0]
    assert first_problems.late > 0 and first_problems.skipped > 0  # both kinds are met
    for trace, problems in results[1:]:
        pd.testing.assert_frame_equal(trace, first_trace)
        assert problems == first_problems
    assert not reading_threads()


def test_a_cost_function_that_raises_stops_the_read_with_its_error(tmp_path):
    path = busy_log(tmp_path, n=200)

    def cost(fields):
        raise OSError("the cost service is down")  # not a bad line: the caller's error

    reader = LogReader(path, cost=cost, read_ahead=1)
    with pytest.raises(OSError, match="the cost service is down"):
        list(reader)
    assert not reading_threads()


def test_a_caller_that_stops_after_one_chunk_closes_the_file(tmp_path):
    path = busy_log(tmp_path)
    reader = LogReader(path, chunk_lines=100, reorder_s=0.0, read_ahead=2)
    chunks = iter(reader)
    assert 0 < len(next(chunks)) <= 100
    assert open_paths().count(str(path)) == 1
    chunks.close()  # type: ignore[attr-defined]
    assert not reading_threads()
    assert str(path) not in open_paths()


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_read_ahead_must_be_a_count(tmp_path, bad):
    path = busy_log(tmp_path, n=10)
    with pytest.raises(ValueError, match="read_ahead"):
        LogReader(path, read_ahead=bad)


def test_read_ahead_on_the_command_line(tmp_path, capsys):
    path = busy_log(tmp_path, n=400)
    plans = []
    for depth in ("0", "3"):
        out = tmp_path / f"plan-{depth}.json"
        arguments = [str(path), "--limit", "5/s", "--no-measure", "--read-ahead", depth]
        assert main(["plan", *arguments, "--json", str(out)]) == 0
        plans.append(out.read_text())
    assert plans[0] == plans[1]
    with pytest.raises(SystemExit):
        main(["plan", str(path), "--read-ahead", "-1"])
    assert "read-ahead must be a whole number >= 0, got '-1'" in capsys.readouterr().err


# --- identities as categories ----------------------------------------------------------


def test_category_identities_are_the_text_identities(tmp_path):
    path = busy_log(tmp_path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(blocks, "BLOCK_BYTES", 4096)
        text = list(LogReader(path, chunk_lines=700, reorder_s=1.0))
        coded = list(LogReader(path, chunk_lines=700, reorder_s=1.0, identity_dtype="category"))
    assert len(text) == len(coded) > 3
    for a, b in zip(text, coded, strict=True):
        assert isinstance(b["identity"].dtype, pd.CategoricalDtype)
        assert b["identity"].astype(str).tolist() == a["identity"].tolist()
        pd.testing.assert_frame_equal(a.drop(columns="identity"), b.drop(columns="identity"))
    with pytest.raises(ValueError, match="identity_dtype"):
        LogReader(path, identity_dtype="object")


def test_a_plan_of_category_chunks_is_the_plan_of_text_chunks(tmp_path):
    path = busy_log(tmp_path)
    plans = []
    for dtype in ("str", "category"):
        chunks = LogReader(path, chunk_lines=400, reorder_s=1.0, identity_dtype=dtype)
        plan = planner.plan_trace(chunks, ["3/s", "20/min"], ["log", "gcra"], measure=False)
        plans.append(plan.to_dict())
    assert plans[0] == plans[1]


@settings(max_examples=80, deadline=None)
@given(
    rows=st.lists(st.integers(0, 30), min_size=1, max_size=200),
    cuts=st.lists(st.integers(1, 40), max_size=8),
    grow=st.booleans(),
)
def test_codes_of_a_categorical_column_are_the_codes_of_its_text(rows, cuts, grow):
    """Chunk by chunk, as a reader gives them: categories that only grow (or, when not
    `grow`, each chunk's own): the same codes as the text, new ones in first-seen order."""
    names = [f"client-{k}" for k in rows]
    by_text, by_category = Codes(), Codes()
    at = 0
    for size in [*cuts, len(names)]:
        part = names[at : at + size]
        at += size
        if not part:
            continue
        if grow:
            seen = list(dict.fromkeys(names[:at]))  # the names read so far, in order
        else:
            seen = list(reversed(dict.fromkeys(part)))
        column = pd.Series(pd.Categorical(part, categories=seen))
        assert by_category.encode(column).tolist() == by_text.encode(part).tolist()
    assert by_category.identities() == by_text.identities()


def test_a_missing_categorical_identity_is_refused():
    column = pd.Series(pd.Categorical(["a", None, "b"]))
    with pytest.raises(ValueError, match="missing"):
        Codes().encode(column)
