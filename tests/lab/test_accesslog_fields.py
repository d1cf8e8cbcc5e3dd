"""`fields=`: a log's other fields carried as text columns of the trace chunks.

Expected values are the texts the test wrote into each line, never the reader's output.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest

from ratelimit.lab.accesslog import LogFormatError, LogReader, read
from ratelimit.lab.accesslog.formats import CLF_FIELDS

from .test_accesslog import clf_time, write

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
AGENTS = ["Mozilla/5.0 (X11; Linux x86_64)", "curl/8.1", "", 'bot \\"quoted\\"', "été/1.0"]


def combined_lines(seed: int, n: int) -> tuple[list[str], list[dict[str, str]]]:
    """Combined lines (some clf, some with extras, some out of order) and the fields
    each was written with, by line."""
    rng = random.Random(seed)
    lines, written = [], []
    for i in range(n):
        when = START + timedelta(seconds=i + rng.choice([0, 0, 0, -30]))
        f = {
            "host": f"192.0.2.{rng.randint(1, 9)}",
            "ident": "-",
            "user": str(i),  # tells which row is which after the reader reorders them
            "method": rng.choice(["GET", "POST", "HEAD"]),
            "path": rng.choice(["/", "/api/tiles/1/2/3", "/q?a=1&b=2"]),
            "protocol": rng.choice(["HTTP/1.1", "HTTP/2.0"]),
            "status": str(rng.choice([200, 404, 503])),
            "bytes": rng.choice(["-", "0", "4312"]),
        }
        f["request"] = f"{f['method']} {f['path']} {f['protocol']}"
        line = (
            f'{f["host"]} {f["ident"]} {f["user"]} [{clf_time(when, 60)}] "{f["request"]}" '
            f"{f['status']} {f['bytes']}"
        )
        kind = rng.choice(["clf", "combined", "extras"])
        f["referer"] = f["agent"] = f["rt"] = f["extra2"] = ""
        if kind != "clf":
            f["referer"], f["agent"] = rng.choice(["-", "https://example.org/"]), rng.choice(AGENTS)
            line += f' "{f["referer"]}" "{f["agent"]}"'
        if kind == "extras":
            f["rt"], f["extra2"] = f"0.{rng.randint(0, 999):03d}", "z"
            line += f" rt={f['rt']} z"
        f["extra1"] = f["rt"]
        lines.append(line)
        written.append(f)
    return lines, written


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_clf_field_is_the_text_written(tmp_path, seed):
    lines, written = combined_lines(seed, 60)
    path = write(tmp_path, lines)
    names = tuple(n for n in CLF_FIELDS if n != "time") + ("rt", "extra1", "extra2")
    trace, problems = read(path, fields=names, chunk_lines=7)
    assert problems.parsed == len(lines)
    assert list(trace.columns) == ["time", "identity", "cost", "replica", *names]
    for name in names:
        assert trace[name].dtype == "str"
        expected = [written[int(u)][name] for u in trace["user"]]
        assert trace[name].tolist() == expected, name
    assert all(type(v) is str for v in trace["agent"])


def test_fields_match_what_a_cost_function_sees(tmp_path):
    lines, _ = combined_lines(4, 40)
    path = write(tmp_path, lines)
    seen: list[dict[str, str]] = []
    read(path, cost=lambda f: seen.append(f) or 1, reorder_s=0)
    names = ("agent", "status", "method", "path", "referer", "rt")
    trace, _ = read(path, fields=names, reorder_s=0)
    # Without reordering, rows keep the file's order for lines of distinct seconds.
    order = sorted(range(len(seen)), key=lambda i: (lines[i].split("[")[1][:26], i))
    for name in names:
        assert trace[name].tolist() == [seen[i].get(name, "") for i in order]


def test_a_request_not_in_three_parts_has_no_method_path_or_protocol(tmp_path):
    when = clf_time(START)
    path = write(
        tmp_path,
        [
            f'192.0.2.1 - - [{when}] "GET /a HTTP/1.1" 200 1',
            f'192.0.2.2 - - [{when}] "garbage" 400 1',
            f'192.0.2.3 - - [{when}] "GET /a b HTTP/1.1" 400 1',
        ],
    )
    trace, _ = read(path, fields=("method", "path", "protocol", "request"))
    assert trace["method"].tolist() == ["GET", "", ""]
    assert trace["path"].tolist() == ["/a", "", ""]
    assert trace["protocol"].tolist() == ["HTTP/1.1", "", ""]
    assert trace["request"].tolist() == ["GET /a HTTP/1.1", "garbage", "GET /a b HTTP/1.1"]


def test_jsonl_and_csv_fields_dotted_and_missing(tmp_path):
    records = [
        {"ts": 1772442000, "ip": "192.0.2.1", "req": {"path": "/a", "ms": 1.50}, "s": 200},
        {"ts": 1772442001, "ip": "192.0.2.2", "req": {"path": "/b"}, "ok": True},
    ]
    path = write(tmp_path, [json.dumps(r) for r in records], "log.jsonl")
    trace, _ = read(path, fields=["req.path", "req.ms", "s", "ok"])
    assert trace["req.path"].tolist() == ["/a", "/b"]
    assert trace["req.ms"].tolist() == ["1.5", ""]
    assert trace["s"].tolist() == ["200", ""]
    assert trace["ok"].tolist() == ["", "true"]
    csv_path = write(
        tmp_path,
        [
            "time,client_ip,agent",
            "2026-03-02T09:00:00Z,192.0.2.1,",
            '2026-03-02T09:00:01Z,192.0.2.1,"a, b"',
        ],
        "log.csv",
    )
    trace, _ = read(csv_path, fields="agent")
    assert trace["agent"].tolist() == ["", "a, b"]


def test_unknown_and_clashing_fields_are_one_error(tmp_path):
    path = write(tmp_path, [f'192.0.2.1 - - [{clf_time(START)}] "GET / HTTP/1.1" 200 1'])
    with pytest.raises(LogFormatError, match=r"no field 'agnet' \(fields=\).*referer, agent"):
        LogReader(path, fields=("agent", "agnet"))
    with pytest.raises(ValueError, match="fields cannot name 'cost'"):
        LogReader(path, fields=("cost",))
    with pytest.raises(ValueError, match="fields must be field names"):
        LogReader(path, fields=("agent", 3))  # type: ignore[arg-type]
    jsonl = write(tmp_path, [json.dumps({"ts": 1, "ip": "192.0.2.1"})], "x.jsonl")
    with pytest.raises(LogFormatError, match=r"no field 'ua' \(fields=\)"):
        LogReader(jsonl, fields=("ua",))


def test_no_fields_keeps_the_trace_as_it_was_and_an_empty_read_has_the_columns(tmp_path):
    path = write(tmp_path, [f'192.0.2.1 - - [{clf_time(START)}] "GET / HTTP/1.1" 200 1'])
    plain, _ = read(path)
    assert list(plain.columns) == ["time", "identity", "cost", "replica"]
    bad = write(tmp_path, [f'- - - [{clf_time(START)}] "GET / HTTP/1.1" 200 1'], "bad.log")
    empty, problems = read(bad, fields=("status", "path"))
    assert problems.parsed == 0 and len(empty) == 0
    assert list(empty.columns) == ["time", "identity", "cost", "replica", "status", "path"]
    assert isinstance(empty, pd.DataFrame) and empty["path"].dtype == "str"
