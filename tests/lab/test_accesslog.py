"""The access-log loaders: formats, detection, fields, time, bad lines, order, chunks.

Expected times are computed here with `datetime` and integer arithmetic, expected
identities with `ipaddress`, expected orders and late counts by brute force over the
lines written, never by running the loader.
"""

from __future__ import annotations

import gzip
import ipaddress
import json
import math
import random
from datetime import UTC, datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit import identity
from ratelimit.lab.accesslog import FORMATS, LogFormatError, LogReader, blocks, detect_format, read
from ratelimit.lab.accesslog.problems import EXAMPLES_PER_REASON, EXCERPT_CHARS
from ratelimit.lab.timebase import seconds_to_ms

MONTHS = "Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split()
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def clf_time(when: datetime, offset_minutes: int = 0, fraction: str = "") -> str:
    """`when` as a CLF time on a clock `offset_minutes` east of UTC."""
    local = when.astimezone(timezone(timedelta(minutes=offset_minutes)))
    sign = "+" if offset_minutes >= 0 else "-"
    hours, minutes = divmod(abs(offset_minutes), 60)
    return (
        f"{local.day:02d}/{MONTHS[local.month - 1]}/{local.year}:{local:%H:%M:%S}{fraction} "
        f"{sign}{hours:02d}{minutes:02d}"
    )


def clf(host: str, user: str, when: datetime, *, offset: int = 0, path: str = "/", size="12"):
    return f'{host} - {user} [{clf_time(when, offset)}] "GET {path} HTTP/1.1" 200 {size}'


def write(tmp_path, lines: list[str], name: str = "access.log", end: str = "\n"):
    path = tmp_path / name
    path.write_bytes((end.join(lines) + end).encode("utf-8"))
    return path


def epoch(when: datetime) -> float:
    return float((when - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(seconds=1))


def network(address: str, prefix: int = 64) -> str:
    """Independent expectation of an address's identity."""
    ip = ipaddress.ip_address(address)
    if ip.version == 6 and prefix < 128:
        return str(ipaddress.ip_network(f"{address}/{prefix}", strict=False))
    return str(ip)


# --- formats and detection ------------------------------------------------------------


def test_common_log_format_line(tmp_path):
    # The example of the Apache documentation: 13:55:36 at UTC-7 is 20:55:36 UTC.
    line = '127.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] "GET /apache_pb.gif HTTP/1.0" 200 2326'
    trace, problems = read(write(tmp_path, [line]))
    expected = datetime(2000, 10, 10, 20, 55, 36, tzinfo=UTC).timestamp()
    assert trace["time"].tolist() == [expected]
    assert trace["identity"].tolist() == ["127.0.0.1"]
    assert trace["cost"].tolist() == [1] and trace["replica"].tolist() == [0]
    assert (problems.lines, problems.parsed, problems.counts) == (1, 1, {})


def test_trace_columns_and_dtypes(tmp_path):
    path = write(tmp_path, [clf("192.0.2.1", "k", START), clf("192.0.2.2", "k", START)])
    trace, _ = read(path)
    assert list(trace.columns) == ["time", "identity", "cost", "replica"]
    assert trace["time"].dtype == np.float64
    assert trace["identity"].dtype == "str"
    assert trace["cost"].dtype == np.int64 and trace["replica"].dtype == np.int64
    assert list(trace.index) == [0, 1]


def test_combined_format_with_extras(tmp_path):
    lines = [
        f'198.51.100.7 - - [{clf_time(START, 60)}] "GET /a?x=1 HTTP/2.0" 404 - '
        f'"https://example.org/" "Mozilla/5.0 (X11; \\"quoted\\")" rt=0.012 key="ak_9"',
        f'198.51.100.8 - - [{clf_time(START, 60)}] "POST /b HTTP/2.0" 201 7 "-" "curl/8"',
    ]
    path = write(tmp_path, lines)
    assert detect_format(path) == "combined"
    trace, problems = read(path, identity="key")
    assert trace["identity"].tolist() == ["ak_9"]
    assert problems.counts == {"no identity": 1}  # the second line has no key= field
    assert [line for line, _, _ in problems.examples] == [2]
    seen = []
    read(path, identity="host", cost=lambda f: seen.append(f) or 1)
    assert seen[0]["referer"] == "https://example.org/"
    assert seen[0]["agent"] == 'Mozilla/5.0 (X11; \\"quoted\\")'
    assert (seen[0]["method"], seen[0]["path"], seen[0]["status"]) == ("GET", "/a?x=1", "404")
    assert (seen[0]["rt"], seen[0]["extra1"], seen[0]["extra2"]) == ("0.012", "0.012", "ak_9")
    assert (seen[1]["method"], seen[1]["bytes"], seen[1]["agent"]) == ("POST", "7", "curl/8")


def test_jsonl_format(tmp_path):
    records = [
        {"time": "2026-03-02T10:00:00.250+01:00", "remote_addr": "192.0.2.1", "u": {"key": "a"}},
        {"time": "2026-03-02T09:00:01Z", "remote_addr": "192.0.2.2", "u": {"key": "b"}},
    ]
    path = write(tmp_path, [json.dumps(r) for r in records], "log.jsonl")
    assert detect_format(path) == "jsonl"
    trace, problems = read(path)
    assert trace["identity"].tolist() == ["192.0.2.1", "192.0.2.2"]
    assert seconds_to_ms(trace["time"]).tolist() == [
        int(epoch(START)) * 1000 + 250,
        int(epoch(START)) * 1000 + 1000,
    ]
    nested, _ = read(path, identity="u.key")
    assert nested["identity"].tolist() == ["a", "b"]
    assert problems.parsed == 2


def test_csv_format(tmp_path):
    lines = [
        "timestamp,client_ip,api_key,units",
        "2026-03-02T09:00:00Z,192.0.2.1,k1,2",
        '2026-03-02T10:00:01+01:00,192.0.2.1,"k,2",3',
        "1772442002.5,192.0.2.1,k1,1",
    ]
    path = write(tmp_path, lines, "log.csv")
    assert detect_format(path) == "csv"
    trace, problems = read(path, identity="api_key", cost="units")
    base = int(epoch(START)) * 1000
    assert seconds_to_ms(trace["time"]).tolist() == [base, base + 1000, base + 2500]
    assert trace["identity"].tolist() == ["k1", "k,2", "k1"]
    assert trace["cost"].tolist() == [2, 3, 1]
    # The header is neither a request nor a bad line.
    assert (problems.lines, problems.parsed, problems.skipped) == (3, 3, 0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_is_detected(tmp_path, fmt):
    when = START
    if fmt == "clf":
        lines = [clf("192.0.2.1", "k", when)] * 3
    elif fmt == "combined":
        lines = [clf("192.0.2.1", "k", when) + ' "-" "agent"'] * 3
    elif fmt == "jsonl":
        lines = [json.dumps({"ts": 1772442000, "ip": "192.0.2.1"})] * 3
    else:
        lines = ["time,host", "2026-03-02T09:00:00Z,192.0.2.1", "2026-03-02T09:00:00Z,192.0.2.2"]
    path = write(tmp_path, lines)
    assert detect_format(path) == fmt
    reader = LogReader(path)
    assert reader.format == fmt
    trace = pd.concat(list(reader))
    assert len(trace) == (2 if fmt == "csv" else 3)
    assert set(seconds_to_ms(trace["time"])) == {int(epoch(when)) * 1000}


def test_named_format_that_does_not_fit_is_one_error(tmp_path):
    path = write(tmp_path, [clf("192.0.2.1", "k", START)] * 3)
    with pytest.raises(LogFormatError, match="not a jsonl log.*line 1"):
        LogReader(path, format="jsonl")
    with pytest.raises(LogFormatError, match="format must be one of"):
        LogReader(path, format="w3c")
    # A clf line is a combined line without referer and agent.
    trace, _ = read(path, format="combined")
    assert len(trace) == 3


def test_a_missing_field_is_one_error_naming_it(tmp_path):
    path = write(tmp_path, [clf("192.0.2.1", "k", START)])
    with pytest.raises(LogFormatError, match=r"no field 'api_key' \(identity=\).*host, ident"):
        LogReader(path, identity="api_key")
    with pytest.raises(LogFormatError, match=r"no field 'units' \(cost=\)"):
        LogReader(path, cost="units")
    jsonl = write(tmp_path, [json.dumps({"ts": 1, "user": "a"})], "x.jsonl")
    with pytest.raises(LogFormatError, match="no client address field.*identity=.*ts, user"):
        LogReader(jsonl)
    untimed = write(tmp_path, [json.dumps({"when": 1, "ip": "192.0.2.1"})], "y.jsonl")
    with pytest.raises(LogFormatError, match="no time field.*time="):
        LogReader(untimed)
    assert len(read(untimed, time="when")[0]) == 1


# --- not a log at all -------------------------------------------------------------------


def test_empty_file(tmp_path):
    path = tmp_path / "empty.log"
    path.write_bytes(b"")
    with pytest.raises(LogFormatError, match="empty"):
        read(path)
    blank = tmp_path / "blank.log"
    blank.write_bytes(b"\n  \n\n")
    with pytest.raises(LogFormatError, match="only blank lines"):
        read(blank)


def test_binary_file(tmp_path):
    path = tmp_path / "image.png"
    rng = random.Random(1)
    path.write_bytes(bytes(rng.randrange(256) for _ in range(5000)))
    with pytest.raises(LogFormatError, match="binary"):
        read(path)
    noisy = tmp_path / "noise.bin"  # no NUL byte, but not text either
    noisy.write_bytes(bytes(rng.randrange(1, 256) for _ in range(5000)))
    with pytest.raises(LogFormatError, match="binary"):
        detect_format(noisy)


def test_prose_is_not_a_log(tmp_path):
    essay = [
        "It was the best of times, it was the worst of times, it was the age of wisdom,",
        "it was the age of foolishness, it was the epoch of belief.",
        "",
        "There were a king with a large jaw and a queen with a plain face.",
    ]
    path = write(tmp_path, essay)
    with pytest.raises(LogFormatError, match="not an access log.*line 1: 'It was"):
        LogReader(path)


def test_missing_file(tmp_path):
    with pytest.raises(LogFormatError, match="no such log file"):
        read(tmp_path / "nope.log")


# --- identity and cost ----------------------------------------------------------------


def test_ipv6_grouped_per_prefix_and_ipv4_as_is(tmp_path):
    addresses = [
        "2001:db8:1:2::1",
        "2001:db8:1:2:aaaa:bbbb:cccc:dddd",  # same /64
        "2001:db8:1:3::1",  # another /64
        "192.0.2.10",
        "192.0.2.11",
        "::ffff:192.0.2.10",  # IPv4-mapped: the IPv4 client
    ]
    lines = [clf(a, "-", START + timedelta(seconds=i)) for i, a in enumerate(addresses)]
    path = write(tmp_path, lines)
    for prefix in (64, 48, 128):
        trace, _ = read(path, ipv6_prefix=prefix)
        expected = [network(a, prefix) for a in addresses[:5]] + ["192.0.2.10"]
        assert trace["identity"].tolist() == expected
        # The HTTP layer's helper says the same.
        assert expected == [identity.address_identity(a, prefix) for a in addresses]
    trace, _ = read(path)
    assert trace["identity"].nunique() == 4


def test_identity_that_is_not_an_address_is_kept_verbatim(tmp_path):
    lines = [clf("gateway.example.org", "ak_1:2", START), clf("192.0.2.1", "cafe::", START)]
    trace, _ = read(write(tmp_path, lines), identity="user")
    # An API key that happens to parse as IPv6 still counts as the address would.
    assert trace["identity"].tolist() == ["ak_1:2", network("cafe::")]
    hosts, _ = read(write(tmp_path, lines, "h.log"))
    assert hosts["identity"].tolist() == ["gateway.example.org", "192.0.2.1"]


def test_user_identity_and_missing_user(tmp_path):
    lines = [clf("192.0.2.1", "ak_a", START), clf("192.0.2.1", "-", START)]
    trace, problems = read(write(tmp_path, lines), identity="user")
    assert trace["identity"].tolist() == ["ak_a"]
    assert problems.counts == {"no identity": 1}
    assert problems.examples[0][:2] == (2, "no identity")


def test_cost_from_a_field_and_bad_costs(tmp_path):
    sizes = ["3", "0", "-", "12", "99999999999999999999"]
    lines = [clf("192.0.2.1", "k", START, size=s) for s in sizes]
    trace, problems = read(write(tmp_path, lines), cost="bytes")
    assert trace["cost"].tolist() == [3, 12]
    assert problems.counts == {"bad cost": 3}
    assert [line for line, _, _ in problems.examples] == [2, 3, 5]
    records = [{"ts": 1772442000 + i, "ip": "192.0.2.1", "c": c} for i, c in
               enumerate([2, 0, -1, 1.5, "4", True, None, "x"])]  # fmt: skip
    jsonl = write(tmp_path, [json.dumps(r) for r in records], "c.jsonl")
    trace, problems = read(jsonl, cost="c")
    assert trace["cost"].tolist() == [2, 4]
    assert problems.counts == {"bad cost": 6}


def test_cost_callable(tmp_path):
    lines = [
        clf("192.0.2.1", "k", START, path="/within?radius_m=1000"),
        clf("192.0.2.1", "k", START, path="/tiles/1/2/3.png"),
        clf("192.0.2.1", "k", START, path="/within?radius_m=oops"),
        clf("192.0.2.1", "k", START, path="/within?radius_m=-5"),
    ]

    def cost(fields):
        if "radius_m=" not in fields["path"]:
            return 1
        radius = float(fields["path"].split("radius_m=")[1])  # ValueError for "oops"
        return math.ceil(radius / 250)  # 0 or less for a negative radius

    trace, problems = read(write(tmp_path, lines), cost=cost)
    assert trace["cost"].tolist() == [4, 1]
    assert problems.counts == {"bad cost": 2}
    assert [line for line, _, _ in problems.examples] == [3, 4]


def test_cost_callable_errors_that_are_bugs_propagate(tmp_path):
    path = write(tmp_path, [clf("192.0.2.1", "k", START)])

    def broken(fields):
        raise RuntimeError("bug")

    with pytest.raises(RuntimeError, match="bug"):
        read(path, cost=broken)


def test_bad_options():
    with pytest.raises(ValueError, match="chunk_lines"):
        LogReader("x.log", chunk_lines=0)
    with pytest.raises(ValueError, match="reorder_s"):
        LogReader("x.log", reorder_s=-1)
    with pytest.raises(ValueError, match="ipv6_prefix"):
        LogReader("x.log", ipv6_prefix=129)
    with pytest.raises(ValueError, match="cost must be"):
        LogReader("x.log", cost=3)


# --- time -----------------------------------------------------------------------------


def test_mixed_offsets_decode_to_the_same_instant(tmp_path):
    offsets = [0, 60, -300, 330, -720, 840, 345]
    lines = [clf(f"192.0.2.{i}", "k", START, offset=o) for i, o in enumerate(offsets)]
    path = write(tmp_path, lines)
    assert len(set(path.read_text().split("["))) > 2  # the offsets really differ
    trace, _ = read(path)
    assert trace["time"].tolist() == [epoch(START)] * len(offsets)
    isos = ["2026-03-02T09:00:00Z", "2026-03-02T10:00:00+01:00", "2026-03-02T03:30:00-05:30"]
    isos += ["2026-03-02T09:00:00", "02/Mar/2026:04:00:00 -0500", "1772442000", "1772442000000"]
    jsonl = write(tmp_path, [json.dumps({"time": t, "ip": "192.0.2.1"}) for t in isos], "t.jsonl")
    trace, problems = read(jsonl)
    assert trace["time"].tolist() == [epoch(START)] * len(isos)
    assert problems.skipped == 0


def test_times_across_a_leap_day_and_year_end(tmp_path):
    instants = [
        datetime(2024, 2, 29, 23, 59, 59, tzinfo=UTC),
        datetime(2024, 12, 31, 23, 30, tzinfo=UTC),
        datetime(1999, 12, 31, 23, 59, 59, tzinfo=UTC),
        datetime(2100, 3, 1, 0, 0, 1, tzinfo=UTC),
    ]
    lines = [clf("192.0.2.1", "k", t, offset=600) for t in instants]
    trace, _ = read(write(tmp_path, lines), reorder_s=1e12)
    assert trace["time"].tolist() == sorted(epoch(t) for t in instants)


def test_impossible_times_are_bad_lines(tmp_path):
    good = clf("192.0.2.1", "k", START)
    stamp = clf_time(START)
    bad = [
        good.replace(stamp, "29/Feb/2026:10:00:00 +0000"),  # not a leap year
        good.replace(stamp, "02/Mar/2026:24:00:00 +0000"),
        good.replace(stamp, "02/Mrz/2026:10:00:00 +0000"),
        good.replace(stamp, "02/Mar/2026:10:00:00"),
        good.replace(stamp, "02/Mar/2026:10:00:00 +0000 "),
        good.replace(stamp, "2026-03-02T10:00:00Z"),
    ]
    trace, problems = read(write(tmp_path, [good, *bad]))
    assert len(trace) == 1
    assert problems.counts == {"bad time": len(bad)}
    assert [line for line, _, _ in problems.examples] == [2, 3, 4, 5, 6]


@settings(max_examples=200, deadline=None)
@given(
    # 1973-03-03 .. 2100: epoch numbers of 1e11 and more are read as milliseconds
    ms=st.integers(10**11, 4_102_444_800_000 - 1),
    offset=st.integers(-14 * 60, 14 * 60),
)
def test_exact_milliseconds(tmp_path_factory, ms, offset):
    """Whatever the format, floor(time * 1000) is the line's own millisecond."""
    tmp = tmp_path_factory.mktemp("ms")
    when = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
    seconds, rest = divmod(ms, 1000)
    line = clf("192.0.2.1", "k", when.replace(microsecond=0), offset=offset)
    stamp = clf_time(when.replace(microsecond=0), offset)
    line = line.replace(stamp, clf_time(when.replace(microsecond=0), offset, f".{rest:03d}"))
    local = when.astimezone(timezone(timedelta(minutes=offset)))
    records = [
        {"time": local.isoformat(timespec="milliseconds"), "ip": "192.0.2.1"},
        {"time": ms, "ip": "192.0.2.1"},
    ]
    jsonl = [json.dumps(r) for r in records]
    jsonl.append(f'{{"time": {seconds}.{rest:03d}, "ip": "192.0.2.1"}}')
    for lines, name in (([line], "a.log"), (jsonl, "b.jsonl")):
        trace, problems = read(write(tmp, lines, name), reorder_s=0)
        assert problems.skipped == 0, problems.summary()
        assert seconds_to_ms(trace["time"]).tolist() == [ms] * len(lines)
        assert [math.floor(t * 1000) for t in trace["time"]] == [ms] * len(lines)


# --- bad lines ------------------------------------------------------------------------


def test_bad_lines_are_counted_with_line_numbers_never_fatal(tmp_path):
    good = [clf("192.0.2.1", "k", START + timedelta(seconds=i)) for i in range(6)]
    lines = [
        good[0],
        "",  # 2 blank
        "GET /index.html HTTP/1.1",  # 3 malformed
        good[1],
        good[2][:40],  # 5 cut short
        good[3].replace('"GET', '"GET\x01'),  # 6 a control byte
        good[4],
        good[5][:-10],  # 8 the last line, cut off without its newline
    ]
    path = tmp_path / "bad.log"
    path.write_bytes("\n".join(lines).encode())
    trace, problems = read(path)
    assert len(trace) == 3
    assert problems.counts == {"blank": 1, "malformed": 3, "truncated": 1}
    assert [(line, why) for line, why, _ in problems.examples] == [
        (2, "blank"),
        (3, "malformed"),
        (5, "malformed"),
        (6, "malformed"),
        (8, "truncated"),
    ]
    assert problems.examples[1][2] == "GET /index.html HTTP/1.1"
    assert (problems.lines, problems.parsed) == (8, 3)
    assert problems.parsed + problems.skipped == problems.lines
    summary = problems.summary()
    assert summary.startswith("5 of 8 lines skipped: 3 malformed (lines 3, 5, 6)")
    assert "1 truncated (line 8)" in summary and "GET /index.html" in summary


def test_a_final_line_without_newline_that_is_whole_is_read(tmp_path):
    path = tmp_path / "a.log"
    path.write_bytes(
        (clf("192.0.2.1", "k", START) + "\r\n" + clf("192.0.2.2", "k", START)).encode()
    )
    trace, problems = read(path)
    assert trace["identity"].tolist() == ["192.0.2.1", "192.0.2.2"]
    assert problems.skipped == 0


def test_a_log_of_bad_lines_only_gives_an_empty_trace(tmp_path):
    lines = [clf("192.0.2.1", "-", START), "junk", clf("192.0.2.1", "-", START)]
    trace, problems = read(write(tmp_path, lines), identity="user")
    assert len(trace) == 0
    assert list(trace.columns) == ["time", "identity", "cost", "replica"]
    assert trace["identity"].dtype == "str" and trace["cost"].dtype == np.int64
    assert problems.counts == {"no identity": 2, "malformed": 1}


def test_summary_when_all_is_well(tmp_path):
    _, problems = read(write(tmp_path, [clf("192.0.2.1", "k", START)] * 3))
    assert problems.summary() == "all 3 lines parsed"


def test_examples_are_capped_per_reason(tmp_path):
    lines = [clf("192.0.2.1", "k", START)] * 10 + ["junk"] * 50
    _, problems = read(write(tmp_path, lines))
    assert problems.counts == {"malformed": 50}
    assert len(problems.examples) == EXAMPLES_PER_REASON
    assert "lines 11, 12, 13, 14, 15, ...)" in problems.summary()


def test_100_kb_lines(tmp_path):
    long_path = "/search?q=" + "x" * 100_000
    lines = [
        clf("192.0.2.1", "k", START, path=long_path),  # valid: read
        "y" * 100_000,  # not a log line
        clf("192.0.2.2", "k", START) + ' "-" "' + "a" * 100_000,  # unclosed agent: partial
        json.dumps({"n": "z" * 100_000}),
        clf("192.0.2.3", "k", START),
    ]
    trace, problems = read(write(tmp_path, lines))
    assert trace["identity"].tolist() == ["192.0.2.1", "192.0.2.2", "192.0.2.3"]
    assert problems.counts == {"malformed": 2}
    assert [line for line, _, _ in problems.partial_examples] == [3]
    examples = problems.examples + problems.partial_examples
    assert all(len(text) <= EXCERPT_CHARS for _, _, text in examples)
    seen = []
    read(write(tmp_path, lines, "b.log"), cost=lambda f: seen.append(f["path"]) or 1)
    assert seen[0] == long_path


def test_lines_over_the_limit_are_skipped_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(blocks, "MAX_LINE_BYTES", 2_000)
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 700)  # long lines span several blocks
    lines = [
        clf("192.0.2.1", "k", START),
        clf("192.0.2.2", "k", START, path="/" + "p" * 5_000),
        clf("192.0.2.3", "k", START),
        "q" * 1_500,  # long, but within the limit: just malformed
        "r" * 9_000,
        clf("192.0.2.4", "k", START),
    ]
    trace, problems = read(write(tmp_path, lines))
    assert trace["identity"].tolist() == ["192.0.2.1", "192.0.2.3", "192.0.2.4"]
    assert problems.counts == {"too long": 2, "malformed": 1}
    assert [(line, why) for line, why, _ in problems.examples] == [
        (2, "too long"),
        (4, "malformed"),
        (5, "too long"),
    ]
    assert problems.lines == 6


def test_gzip_log_reads_as_the_plain_one(tmp_path):
    lines = [clf(f"192.0.2.{i % 7}", "k", START + timedelta(seconds=i)) for i in range(500)]
    plain = write(tmp_path, lines)
    packed = tmp_path / "access.log.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    a, pa = read(plain)
    b, pb = read(packed)
    pd.testing.assert_frame_equal(a, b)
    assert pa == pb


# --- order ----------------------------------------------------------------------------


def merged_log(seed: int, servers: int = 3, per_server: int = 400, lag_s: float = 40.0):
    """Lines of several servers, each in time order, merged in blocks as a log shipper
    would: the merged file is out of order by up to about `lag_s`."""
    rng = random.Random(seed)
    logs = []
    for server in range(servers):
        t = epoch(START) + rng.uniform(0, lag_s)
        times = []
        for _ in range(per_server):
            t += rng.expovariate(2.0)
            times.append(int(t))
        logs.append([(s, f"192.0.2.{server}", f"k{rng.randrange(20)}") for s in times])
    merged = []
    while any(logs):
        source = rng.choice([log for log in logs if log])
        take = rng.randrange(1, 30)
        merged += source[:take]
        del source[:take]
    return merged


def late_brute_force(times: list[float], horizon: float) -> list[int]:
    """0-based indices of lines more than `horizon` older than a line before them."""
    return [i for i in range(1, len(times)) if times[i] < max(times[:i]) - horizon]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_out_of_order_merged_log_is_sorted_within_the_horizon(tmp_path, monkeypatch, seed):
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 4_096)
    rows = merged_log(seed)
    lines = [clf(h, u, datetime.fromtimestamp(s, UTC), offset=60 * (i % 3)) for i, (s, h, u) in
             enumerate(rows)]  # fmt: skip
    path = write(tmp_path, lines)
    times = [float(s) for s, _, _ in rows]
    assert times != sorted(times)
    assert not late_brute_force(times, 300.0)
    trace, problems = read(path, chunk_lines=97, reorder_s=300.0)
    expected = sorted(range(len(rows)), key=lambda i: (times[i], i))  # stable sort
    assert trace["time"].tolist() == [times[i] for i in expected]
    assert trace["identity"].tolist() == [rows[i][1] for i in expected]
    assert problems.late == 0 and problems.parsed == len(rows)


@pytest.mark.parametrize("horizon", [0.0, 5.0, 20.0])
def test_late_lines_are_counted_and_not_lost(tmp_path, monkeypatch, horizon):
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 4_096)
    rows = merged_log(7, lag_s=60.0)
    lines = [clf(h, u, datetime.fromtimestamp(s, UTC)) for s, h, u in rows]
    lines.insert(50, "not a log line")
    path = write(tmp_path, lines)
    times = [float(s) for s, _, _ in rows]
    late = late_brute_force(times, horizon)
    assert late  # the test means something
    trace, problems = read(path, chunk_lines=50, reorder_s=horizon)
    assert problems.late == len(late)
    # File line numbers: one bad line was inserted before row 50.
    numbers = [i + 1 + (i >= 50) for i in late]
    assert [line for line, _, _ in problems.late_examples] == numbers[
        : EXAMPLES_PER_REASON
    ]
    assert problems.parsed + problems.skipped == problems.lines == len(lines)
    # Nothing lost: the same requests, as a multiset.
    got = sorted(zip(trace["time"], trace["identity"], strict=True))
    assert got == sorted((t, h) for t, (_, h, _) in zip(times, rows, strict=True))
    assert f"{len(late)} lines more than {horizon:g} s older" in problems.summary()


def test_chunks_are_sorted_and_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 2_048)
    rows = merged_log(11, lag_s=60.0)
    lines = [clf(h, u, datetime.fromtimestamp(s, UTC)) for s, h, u in rows]
    path = write(tmp_path, lines)
    horizon = 30.0
    reader = LogReader(path, chunk_lines=64, reorder_s=horizon)
    chunks = list(reader)
    assert all(0 < len(c) <= 64 for c in chunks)
    assert all(c["time"].is_monotonic_increasing for c in chunks)
    # The reorder buffer never holds more than the lines of some prefix of the file
    # that are within the horizon of that prefix's newest line.
    times = np.array([float(s) for s, _, _ in rows])
    newest = np.maximum.accumulate(times)
    bound = max(int((times[:k] > newest[k - 1] - horizon).sum()) for k in range(1, len(times) + 1))
    assert 0 < reader.peak_buffered <= bound
    assert sum(len(c) for c in chunks) == len(rows)


def test_chunked_reading_equals_the_whole_read(tmp_path, monkeypatch):
    rows = merged_log(5)
    lines = [clf(h, u, datetime.fromtimestamp(s, UTC)) for s, h, u in rows]
    lines[10:10] = ["junk", ""]
    path = write(tmp_path, lines)
    whole, whole_problems = read(path, chunk_lines=10**6)
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 1_000)
    for chunk_lines in (1, 7, 100):
        reader = LogReader(path, chunk_lines=chunk_lines)
        chunks = list(reader)
        assert max(len(c) for c in chunks) <= chunk_lines
        pd.testing.assert_frame_equal(pd.concat(chunks, ignore_index=True), whole)
        assert reader.problems == whole_problems


def test_reading_twice_gives_the_same(tmp_path):
    reader = LogReader(write(tmp_path, [clf("192.0.2.1", "k", START), "junk"]))
    first = pd.concat(list(reader))
    problems = reader.problems
    second = pd.concat(list(reader))
    pd.testing.assert_frame_equal(first, second)
    assert reader.problems == problems and problems.lines == 2


# --- progress ---------------------------------------------------------------------------


def test_progress_bar_is_silent_under_pytest_and_counts_bytes(tmp_path, capsys):
    assert blocks._bar(10**12, None).disable
    assert blocks._bar(10, None).disable
    path = write(tmp_path, [clf("192.0.2.1", "k", START)] * 100)
    reader = LogReader(path, progress=True)
    list(reader)
    err = capsys.readouterr().err
    assert "B/s" in err  # a bar counting bytes was drawn
