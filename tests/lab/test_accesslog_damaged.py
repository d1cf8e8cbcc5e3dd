"""Damaged logs: partial lines, binary bytes, bad heads, gzip files cut off or corrupt;
and a fuzz test over random truncations and byte corruptions through the command line.

Expected lines are the ones the test wrote (or a read of the undamaged file, for what a
damaged one must still give), never the damaged read itself.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import random
import zlib
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest

from ratelimit.lab.__main__ import PROG, main
from ratelimit.lab.accesslog import LogFormatError, LogReader, detect_format, formats, read

from .test_accesslog import clf_time

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
AGENTS = ["Mozilla/5.0 (X11; Linux x86_64) Firefox/120.0", "curl/8.1", "Googlebot/2.1"]


def log_lines(seed: int, n: int, combined: bool = True) -> list[str]:
    """`n` real-shaped lines, a few clients, a request every 0-3 s, some a little out
    of order."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        when = START + timedelta(seconds=2 * i + rng.choice([0, 0, 1, -3]))
        line = (
            f"192.0.2.{rng.randint(1, 6)} - - [{clf_time(when, 60)}] "
            f'"GET /api/{rng.randint(1, 99)} HTTP/1.1" {rng.choice([200, 404])} '
            f"{rng.randint(1, 9999)}"
        )
        if combined:
            line += f' "-" "{rng.choice(AGENTS)}"'
        lines.append(line)
    return lines


def write_log(path, lines: list[str], gz: bool = False):
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


# --- partial lines ----------------------------------------------------------------------


def test_a_line_with_client_time_and_request_counts_even_if_later_fields_are_broken(tmp_path):
    when = clf_time(START)
    head = f'192.0.2.1 - - [{when}] "GET /a HTTP/1.1"'
    lines = [
        f'{head} 200 12 "-" "Mozilla unclosed',  # 1 the agent's quote never closes
        f"{head} 2x0 12",  # 2 a status that is not one
        f"{head} 200 1\x00",  # 3 a NUL in the bytes
        f'{head} 200 12 "-" "curl\x01"',  # 4 a control byte in the agent
        f'{head} 200 12 "https://example.org/" "ok"',  # 5 whole
        f'192.0.2.1 - - [{when}] "GET /a HTTP/1.1 200 12',  # 6 the request never closes
        f"{head} 200",  # 7 no bytes: cut off, the last line
    ]
    path = tmp_path / "partial.log"
    path.write_bytes("\n".join(lines).encode())
    trace, problems = read(path, fields=("status", "bytes", "referer", "agent"))
    assert problems.partial == 5
    assert [line for line, _, _ in problems.partial_examples] == [1, 2, 3, 4, 7]
    assert problems.counts == {"malformed": 1}  # only the unreadable request
    assert (problems.lines, problems.parsed) == (7, 6)
    assert trace["status"].tolist() == ["200", "", "200", "200", "200", "200"]
    assert trace["bytes"].tolist() == ["12", "", "", "12", "12", ""]
    assert trace["referer"].tolist() == ["-", "", "", "-", "https://example.org/", ""]
    assert trace["agent"].tolist() == ["", "", "", "", "ok", ""]
    assert "5 partial (lines 1, 2, 3, 4, 7, ...)" not in problems.summary()
    assert "5 partial (lines 1, 2, 3, 4, 7): client, time and request read" in problems.summary()
    # A field that a partial line lacks is not made up: as an identity, it is missing.
    by_agent, problems = read(path, identity="agent")
    assert by_agent["identity"].tolist() == ["ok"]
    assert problems.counts["no identity"] == 5


def test_binary_bytes_spoil_their_line_not_the_log(tmp_path):
    lines = log_lines(1, 50)
    lines[0] = lines[0][:20] + "\x00\x00\xff\xfe" + lines[0][20:]  # the client's address
    lines[3] = "\x00" * 40  # a run of NULs, as a crash leaves
    path = tmp_path / "nul.log"
    path.write_bytes(b"\n".join(line.encode("latin-1") for line in lines) + b"\n")
    assert detect_format(path) == "combined"
    trace, problems = read(path)
    assert problems.counts == {"malformed": 2}
    assert [line for line, _, _ in problems.examples] == [1, 4]
    assert problems.parsed == 48
    mostly_binary = tmp_path / "mostly.bin"
    rng = random.Random(3)
    noise = bytes(rng.randrange(256) for _ in range(30_000))
    mostly_binary.write_bytes(("\n".join(lines[5:15]) + "\n").encode() + noise)
    with pytest.raises(LogFormatError, match=r"binary data \(\d+% of its first"):
        read(mostly_binary)


@pytest.mark.parametrize("named", [None, "combined"])
def test_a_bad_head_does_not_refuse_a_log_that_is_mostly_good(tmp_path, named):
    good = log_lines(2, 600)
    junk = [f"upstream timed out ({k}: Connection timed out) while reading" for k in range(40)]
    path = write_log(tmp_path / "bad-head.log", junk + good)
    trace, problems = read(path, format=named)
    assert problems.parsed == len(good)
    assert problems.counts == {"malformed": len(junk)}
    assert LogReader(path).format == "combined"


def test_a_head_of_junk_longer_than_the_head_is_sampled_past(tmp_path, monkeypatch):
    monkeypatch.setattr(formats, "HEAD_BYTES", 4096)  # the junk outlasts the head read
    junk = [
        f"error {k}: something went to the access log that is not a request" for k in range(300)
    ]
    good = log_lines(3, 2000)
    path = write_log(tmp_path / "junk.log", junk + good)
    assert detect_format(path) == "combined"
    _, problems = read(path, format="clf")
    assert problems.parsed == len(good)
    prose = write_log(tmp_path / "prose.log", junk * 20)
    with pytest.raises(LogFormatError, match="not an access log"):
        read(prose)


# --- gzip cut off or damaged -------------------------------------------------------------


def test_a_gzip_cut_off_gives_what_was_read_and_says_where_it_stopped(tmp_path):
    lines = log_lines(4, 3000)
    data = gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0)
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(data[: len(data) // 2])
    trace, problems = read(cut)
    assert 0 < problems.lines < len(lines)
    assert f"cut off) at byte {len(data) // 2:,} of {len(data) // 2:,}" in problems.stopped
    assert f"after line {problems.lines:,}" in problems.stopped
    assert "warning: the gzip data ends early" in problems.summary()
    # What was read is all that zlib can decompress of the cut file, read as plain text.
    readable = zlib.decompressobj(31).decompress(data[: len(data) // 2])
    plain = tmp_path / "readable.log"
    plain.write_bytes(readable)
    expected, expected_problems = read(plain)
    pd.testing.assert_frame_equal(trace, expected)
    assert (problems.lines, problems.counts) == (expected_problems.lines, expected_problems.counts)
    assert len(expected) >= readable.count(b"\n") - 1


def test_a_damaged_gzip_stops_with_a_warning_not_an_exception(tmp_path):
    lines = log_lines(5, 3000)
    data = bytearray(gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0))
    middle = len(data) // 2
    data[middle : middle + 8] = b"\xff" * 8
    path = tmp_path / "damaged.log.gz"
    path.write_bytes(bytes(data))
    with pytest.raises((zlib.error, OSError, EOFError)):
        gzip.decompress(bytes(data))  # what the standard library makes of it
    trace, problems = read(path)
    assert problems.stopped.startswith("the gzip data is damaged")
    assert "reading stopped after line" in problems.stopped
    assert problems.parsed <= len(lines) and problems.lines > 0


def test_gzip_members_and_zero_padding_are_read_whole(tmp_path):
    lines = log_lines(6, 400)
    data = b"".join(
        gzip.compress(("\n".join(part) + "\n").encode(), mtime=0)
        for part in (lines[:150], lines[150:])
    )
    path = tmp_path / "members.log.gz"
    path.write_bytes(data + b"\x00" * 512)
    trace, problems = read(path)
    assert (problems.lines, problems.parsed, problems.stopped) == (400, 400, "")
    plain, _ = read(write_log(tmp_path / "plain.log", lines))
    pd.testing.assert_frame_equal(trace, plain)


def test_a_gzip_with_nothing_readable_is_one_error(tmp_path):
    data = gzip.compress(("\n".join(log_lines(7, 100)) + "\n").encode(), mtime=0)
    for size in (4, 12):
        path = tmp_path / f"stub{size}.log.gz"
        path.write_bytes(data[:size])
        with pytest.raises(LogFormatError, match=f"stub{size}.log.gz is a gzip file with no line"):
            read(path)


# --- through the command line ------------------------------------------------------------


def run_cli(path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["plan", str(path), "--no-measure", "--algorithm", "log", "--no-progress"])
        except SystemExit as exc:  # argparse's exit: not expected here, but reported
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def test_a_cut_off_gzip_plans_with_the_warning(tmp_path):
    data = gzip.compress(("\n".join(log_lines(8, 2000)) + "\n").encode(), mtime=0)
    path = tmp_path / "cut.log.gz"
    path.write_bytes(data[: len(data) * 2 // 3])
    code, out, err = run_cli(path)
    assert code == 0, err
    assert "Who is hurt" in out
    assert "warning: the gzip data ends early" in err and "reading stopped after line" in err


def damaged(rng: random.Random, data: bytes) -> bytes:
    """`data` cut off, corrupted at a few bytes, with a binary run inserted, or several."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(["cut", "bytes", "run"])
        if kind == "cut" and out:
            del out[rng.randrange(len(out)) :]
        elif kind == "bytes" and out:
            for _ in range(rng.randint(1, 8)):
                out[rng.randrange(len(out))] = rng.choice(
                    [0, 10, 34, 32, 91, 93, 255, rng.randrange(256)]
                )
        elif kind == "run":
            at = rng.randrange(len(out) + 1)
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    return bytes(out)


def test_fuzz_damaged_logs_end_in_a_plan_or_one_line(tmp_path):
    """Random truncations and corruptions of plain and gzip, clf and combined logs: the
    reader ends in a trace (its tallies adding up) or one LogFormatError; the command
    line in a plan (exit 0) or one line on stderr naming the file (exit 1), never a
    traceback."""
    rng = random.Random(20261206)
    codes = []
    for case in range(120):
        combined, gz = case % 2 == 0, case % 4 >= 2
        text = ("\n".join(log_lines(case, 60, combined)) + "\n").encode()
        data = damaged(rng, gzip.compress(text, mtime=0) if gz else text)
        if case % 16 == 8:  # cut within its first line or the gzip header
            data = data[: rng.randrange(60)]
        path = tmp_path / f"case{case}.log{'.gz' if gz else ''}"
        path.write_bytes(data)
        try:
            trace, problems = read(path)
        except LogFormatError as exc:
            assert "\n" not in str(exc)
        else:
            assert problems.parsed + problems.skipped == problems.lines
            assert len(trace) == problems.parsed
            assert trace["time"].notna().all() and (trace["cost"] == 1).all()
        if case % 8 == 0:  # the command line costs more: every eighth case
            code, out, err = run_cli(path)
            codes.append(code)
            if code == 0:
                assert "Who is hurt" in out, err
            else:
                assert code == 1 and out == ""
                assert err.count("\n") == 1 and err.startswith(f"{PROG} plan: error: ")
                assert path.name in err
            assert "Traceback" not in err
    assert len(codes) == 15 and {0, 1} <= set(codes)  # plans and refusals both met


def test_the_json_of_a_cut_off_gzip_carries_the_warning(tmp_path):
    data = gzip.compress(("\n".join(log_lines(9, 500)) + "\n").encode(), mtime=0)
    path = tmp_path / "cut.log.gz"
    path.write_bytes(data[: len(data) // 2])
    out = tmp_path / "plan.json"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main(["plan", str(path), "--no-measure", "--algorithm", "log", "--json", str(out)])
    assert code == 0
    summary = json.loads(out.read_text())["log"]["problems"]["summary"]
    assert "warning: the gzip data ends early" in summary
