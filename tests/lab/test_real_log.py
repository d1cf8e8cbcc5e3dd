"""`tools/real_log.py`, which keeps the plans of a real log for chapter 8 and the README,
run on a combined log written here (the real one is not in the repository), and the
chapter's tables read from what it keeps, the committed plans included."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from ratelimit.lab.__main__ import main as lab_main
from ratelimit.lab.chapters import your_traffic
from tests.lab.test_make_plan import load_tool

ROOT = Path(__file__).resolve().parents[2]


real_log = load_tool("real_log")


def combined_log(path: Path, seed: int = 3) -> None:
    """Half an hour of a small site: a few clients, two of them fast readers of the
    blog, pages under /blog/, /presentations/ and elsewhere, some POSTs."""
    rng = np.random.default_rng(seed)
    start = datetime(2015, 5, 17, 10, 0, tzinfo=UTC)
    clients = {"66.249.73.135": 1.2, "83.149.9.216": 0.5, "24.236.252.67": 0.05,
               "2001:db8::7": 0.1, "crawler.example.org": 0.8}  # fmt: skip
    rows = []
    for client, rate in clients.items():
        seconds = np.cumsum(rng.exponential(1 / rate, size=int(rate * 1_800 * 2)))
        rows += [(int(s), client) for s in seconds if s < 1_800]
    rows.sort()
    lines = []
    for second, client in rows:
        stamp = (start + timedelta(seconds=second)).strftime("%d/%b/%Y:%H:%M:%S %z")
        page = rng.choice(["/blog/tags/redis", "/presentations/logstash/", "/index.html"])
        method = "POST" if rng.random() < 0.1 else "GET"
        lines.append(f'{client} - - [{stamp}] "{method} {page} HTTP/1.1" 200 512 "-" "Agent/1.0"')
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    folder = tmp_path_factory.mktemp("real")
    log = folder / "logs" / "access_log"
    log.parent.mkdir()
    combined_log(log)
    out, figure = folder / "kept", folder / "figures" / "real.png"
    described = real_log.run(log, "a combined log written by the test", out, figure)
    return log, out, figure, described


def test_it_keeps_both_plans_the_figure_and_the_source(kept):
    log, out, figure, described = kept
    assert sorted(p.name for p in out.iterdir()) == ["plan.json", "routes.json", "source.json"]
    assert figure.read_bytes().startswith(b"\x89PNG")
    data = log.read_bytes()
    assert described["sha256"] == hashlib.sha256(data).hexdigest()
    assert described["lines"] == data.count(b"\n") and described["bytes"] == len(data)
    assert json.loads((out / "source.json").read_text()) == described
    plan = json.loads((out / "plan.json").read_text())
    assert plan["log"]["path"] == "access_log" and plan["log"]["requests"] == described["lines"]
    assert [c["limit_text"] for c in plan["candidates"]] == [real_log.LIMIT] * 4
    assert {r["algorithm"] for r in plan["recommended"]} == {"log", "fw", "swc", "gcra"}
    for doc in out.iterdir():  # no path of this machine in what is committed
        assert str(log.parent) not in doc.read_text()


def test_the_kept_commands_plan_the_same_again(kept, tmp_path, monkeypatch):
    log, out, _, described = kept
    monkeypatch.chdir(log.parent)
    for name in ("plan", "routes"):
        argv = [tmp_path / a if a.endswith((".json", ".png")) else a
                for a in described["commands"][name]]  # fmt: skip
        with contextlib.redirect_stdout(io.StringIO()):
            assert lab_main([str(a) for a in argv]) == 0
        assert (tmp_path / f"{name}.json").read_text() == (out / f"{name}.json").read_text()


def test_the_chapter_tables_add_up(kept):
    _, out, _, _ = kept
    documents = your_traffic.real_log(out)
    tables = your_traffic.real_log_tables(documents)
    routes = documents["routes"]
    assert len(tables["candidates"]) == 4 and len(tables["recommended"]) == 4
    by_route = tables["routes"].drop_duplicates("route").set_index("route")["requests"]
    assert list(by_route.index) == ["blog", "presentations", "(no route)"]
    assert by_route.sum() == routes["where"]["kept"]  # every GET request counted once
    assert routes["where"]["kept"] < documents["plan"]["log"]["requests"]  # POSTs filtered
    for r in documents["plan"]["recommended"]:  # at most the share, or what no limit avoids
        allowed = math.floor(r["affect"] * r["identities"])
        assert r["identities_affected"] <= max(allowed, r["unavoidable"])
    assert tables["recommended"]["clients affected"].tolist() == [
        r["identities_affected"] for r in documents["plan"]["recommended"]
    ]


def test_the_committed_plans_are_a_real_log_s():
    documents = your_traffic.real_log(ROOT / "notebooks" / your_traffic.REAL_LOG_DIR)
    source = documents["source"]
    assert "apache_logs" in source["source"] and len(source["sha256"]) == 64
    assert documents["plan"]["log"]["path"] == "apache_logs"
    assert documents["plan"]["log"]["requests"] == source["lines"]
    assert (ROOT / "notebooks" / "figures" / "08_real_log.png").is_file()
