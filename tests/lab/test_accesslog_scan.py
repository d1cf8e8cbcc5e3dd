"""The compiled CLF scan's quick ways agree with the slow ones they stand in for: a
quoted field or a bracketed time read without a branch a byte, a time read once for the
lines that share it, and blocks read, cut and scanned in a thread of their own."""

from __future__ import annotations

import gzip
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit.lab.accesslog import LogReader, blocks, clf

from .test_accesslog import clf_time
from .test_accesslog_ahead import reading_threads

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
# The bytes the quick ways look for, and some that they must pass over.
ALPHABET = b'"\\] [\x00\x01\t\n\x7fa0/:+-.'


@settings(max_examples=500, deadline=None)
@given(text=st.binary(max_size=60).map(lambda b: bytes(ALPHABET[c % len(ALPHABET)] for c in b)),
       data=st.data())  # fmt: skip
def test_the_quick_field_ends_are_the_stepwise_ones(text, data):
    buf = np.frombuffer(text + b"x", dtype=np.uint8)  # one byte past the end is readable
    p = data.draw(st.integers(0, len(text)))
    e = data.draw(st.integers(p, len(text)))
    assert clf._quoted(buf, p, e) == clf._quoted_stepwise(buf, p, e)
    assert clf._bracketed(buf, p, e) == clf._bracketed_stepwise(buf, p, e)


def test_the_usual_time_with_a_control_byte_or_bracket_inside_is_read_stepwise():
    good = clf_time(START).encode()  # 26 bytes
    assert len(good) == 26
    for inside, expected in ((good, 26), (good[:5] + b"\x01" + good[6:], -1),
                             (good[:5] + b"]" + good[6:], 5)):  # fmt: skip
        buf = np.frombuffer(inside + b'] "GET / HTTP/1.1"', dtype=np.uint8)
        assert clf._bracketed(buf, 0, len(buf)) == expected


LINES = [  # (client, seconds after START, offset minutes, fraction)
    ("a", 0, 0, ""), ("b", 0, 0, ""), ("c", 0, 60, ""), ("a", 0, 60, ""), ("b", 1, 0, ""),
    ("c", 1, 0, ".250"), ("a", 1, 0, ".250"), ("b", 1, 0, ""), ("c", 2, 0, ""),
]  # fmt: skip


def _lines() -> list[bytes]:
    out = []
    for k, (client, seconds, offset, fraction) in enumerate(LINES):
        when = clf_time(START + timedelta(seconds=seconds), offset, fraction)
        out.append(f'{client} - - [{when}] "GET /{k} HTTP/1.1" 200 {k}'.encode())
    out.insert(3, b'bad - - [02/Mar/2026:09:00:00 +0000 "GET / HTTP/1.1" 200 1')  # no ']'
    out.insert(6, b'a - - [02/Mar/2026:09:00:00 +0000] "GET / HTTP/1.1" 200 1')  # the same
    out.insert(7, b'a - - [31/Feb/2026:09:00:00 +0000] "GET / HTTP/1.1" 200 1')  # no such day
    return out


def test_a_block_gives_each_line_the_time_it_would_have_alone():
    lines = _lines()
    spans, times, verdicts = clf._scan(blocks._lines_of(b"\n".join(lines) + b"\n", 1, False))
    for i, line in enumerate(lines):
        _, alone_times, alone_verdicts = clf._scan(blocks._lines_of(line + b"\n", 1, False))
        assert (times[i], verdicts[i]) == (alone_times[0], alone_verdicts[0]), line
    # The same instant written at another offset is the same time; a fraction is not.
    assert times[0] == times[1] == times[2] == times[4] == times[6]
    assert times[5] == times[10] != times[8] == times[9]
    assert verdicts[3] == 2 and verdicts[7] == 3  # malformed; a day that is not
    assert len(set(times[verdicts == 0].tolist())) == 4


def test_blocks_read_in_a_thread_count_the_same_problems(tmp_path, monkeypatch):
    """Too-long lines and a cut-off gzip are found where the blocks are cut; read ahead,
    that is another thread, which hands them to the reader to count, in file order."""
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 1024)
    monkeypatch.setattr(blocks, "MAX_LINE_BYTES", 1500)
    lines = []
    for k in range(400):
        when = clf_time(START + timedelta(seconds=k))
        lines.append(f'198.51.100.{k % 7} - - [{when}] "GET /{k} HTTP/1.1" 200 {k}')
        if k % 90 == 45:
            lines.append("x" * 4000)  # spans blocks: counted, skipped unread
    data = ("\n".join(lines) + "\n").encode()
    plain = tmp_path / "access.log"
    plain.write_bytes(data)
    cut = tmp_path / "access.log.gz"
    cut.write_bytes(gzip.compress(data, mtime=0)[:-600])
    for path in (plain, cut):
        results = []
        for read_ahead in (0, 2):
            reader = LogReader(path, format="clf", read_ahead=read_ahead, chunk_lines=64)
            results.append((pd.concat(list(reader), ignore_index=True), reader.problems))
        (first, problems), (second, problems_ahead) = results
        pd.testing.assert_frame_equal(first, second)
        assert problems == problems_ahead
        assert bool(problems.stopped) == (path is cut)
        assert problems.counts["too long"] == 4 or (path is cut and problems.counts["too long"])
    assert not reading_threads()


@pytest.mark.parametrize("read_ahead", [0, 1])
def test_a_sorted_log_is_released_whole_and_in_order(tmp_path, read_ahead):
    times = [clf_time(START + timedelta(seconds=k // 3)) for k in range(3000)]
    lines = [f'198.51.100.{k % 5} - - [{t}] "GET / HTTP/1.1" 200 1' for k, t in enumerate(times)]
    path = tmp_path / "sorted.log"
    path.write_text("\n".join(lines) + "\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(blocks, "BLOCK_BYTES", 4096)
        reader = LogReader(path, reorder_s=10.0, read_ahead=read_ahead, chunk_lines=700)
        trace = pd.concat(list(reader), ignore_index=True)
    assert len(trace) == 3000 and trace["time"].is_monotonic_increasing
    assert reader.peak_buffered > 0  # held back for the horizon, then let go
    assert reader.problems.late == 0 and reader.problems.parsed == 3000
