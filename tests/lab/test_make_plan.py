"""`make plan` on a log that is not the example: a combined log written here, shaped like a
real one (host names and addresses as clients, a server at UTC-07:00, referrers and user
agents, whole-second stamps). The page it writes must describe that log, with figures
counted here independently of the lab; every failure must be one line on stderr."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import defaultdict, deque
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from tests.book.test_plan import _outputs

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "plan_page.py"
PYTHON = ROOT / ".venv" / "bin" / "python"
OFFSET = timezone(timedelta(hours=-7))
LIMIT, WINDOW_S = 30, 60  # "30/min"
CRAWLER = "crawl-66-249-66-1.search.example"
# Client, requests per second, seconds active: one crawler far above the limit, one
# client near it, the rest well below.
CLIENTS = [
    (CRAWLER, 1.5, 240),
    ("proxy.example.net", 0.45, 900),
    ("203.0.113.9", 0.08, 1_800),
    ("198.51.100.23", 0.05, 1_800),
    ("mail.example.org", 0.03, 1_800),
    ("2001:db8:1:2::5", 0.04, 1_800),
]


def load_tool(name: str):
    """`tools/<name>.py` as a module (the tools folder is not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


plan_page = load_tool("plan_page")


def _combined_log(path: Path, seed: int = 11) -> list[tuple[int, str]]:
    """Write a combined log at UTC-07:00, in time order; returns each request's (UTC epoch
    second, client)."""
    rng = np.random.default_rng(seed)
    start = datetime(2026, 3, 14, 9, 0, 0, tzinfo=OFFSET)
    sent = []
    for client, rate, active_s in CLIENTS:
        begin = float(rng.uniform(0, 1_800 - active_s))
        t = np.cumsum(rng.exponential(1 / rate, size=int(rate * active_s * 2)))
        sent += [(int(begin + x), client) for x in t if x < active_s]
    sent.sort()
    lines = []
    for second, client in sent:
        local = (start + timedelta(seconds=second)).strftime("%d/%b/%Y:%H:%M:%S %z")
        agent = "SearchBot/2.1 (+https://search.example/bot)" if client == CRAWLER else (
            "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0")  # fmt: skip
        page = f"/products/{int(rng.integers(1, 400))}?ref=home"
        size = int(rng.integers(200, 40_000))
        lines.append(
            f'{client} - - [{local}] "GET {page} HTTP/1.1" 200 {size} '
            f'"https://shop.example/" "{agent}"'
        )
    path.write_text("\n".join(lines) + "\n")
    epoch = int(start.timestamp())
    return [(epoch + second, client) for second, client in sent]


def _sliding_log_rejections(sent: list[tuple[int, str]]) -> tuple[int, set[str]]:
    """The exact sliding log, counted by hand: admit a request while fewer than LIMIT were
    admitted in (t - W, t]. Returns the requests rejected and the clients they came from."""
    admitted: dict[str, deque[int]] = defaultdict(deque)
    rejected, hurt = 0, set()
    for t, client in sent:
        window = admitted[client]
        while window and window[0] <= t - WINDOW_S:
            window.popleft()
        if len(window) < LIMIT:
            window.append(t)
        else:
            rejected, hurt = rejected + 1, hurt | {client}
    return rejected, hurt


_text = _outputs  # a notebook's text outputs, as tests/book/test_plan.py reads them


def _make_plan(*variables: str) -> subprocess.CompletedProcess[str]:
    """`make plan` as a user types it: not as a sub-make of `make test` (whose flags and
    level would change what make prints)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(["make", "--no-print-directory", "plan", *variables], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=env)  # fmt: skip


def _ours(stderr: str) -> list[str]:
    """stderr without make's own closing line (`make: *** [Makefile:N: plan] Error 1`)."""
    return [line for line in stderr.splitlines() if not line.startswith("make: *** ")]


@pytest.mark.timeout(600)
def test_make_plan_describes_a_real_shaped_combined_log(tmp_path):
    pytest.importorskip("papermill")
    log = tmp_path / "shop-access.log"
    sent = _combined_log(log)
    out = tmp_path / "plan"
    done = _make_plan(f"LOG={log}", f"LIMIT={LIMIT}/min", f"PLAN_DIR={out}")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    notebook, html = out / "08_your_traffic.ipynb", out / "08_your_traffic.html"
    assert done.stdout.strip() == f"make plan: {html}"
    page = " ".join(html.read_text().split())  # the prose's line breaks as spaces
    text = _text(json.loads(notebook.read_text()))

    clients = {client for _, client in sent}
    clients = {c if ":" not in c else "2001:db8:1:2::/64" for c in clients}  # a /64 each
    rejected, hurt = _sliding_log_rejections(sent)
    assert 0 < rejected < len(sent) and CRAWLER in hurt  # the crawler is throttled
    first = datetime.fromtimestamp(sent[0][0], UTC).strftime("%Y-%m-%d %H:%M:%S")
    last = datetime.fromtimestamp(sent[-1][0], UTC).strftime("%Y-%m-%d %H:%M:%S")
    summary = (
        f"On {len(sent):,} requests from {len(clients):,} identities, {LIMIT}/min touches "
        f"{len(hurt)} identities ({len(hurt) / len(clients):.1%})"
    )
    assert summary in text and f"rejects {rejected / len(sent):.1%} of requests" in text
    assert f"all {len(sent):,} lines parsed" in text
    # The prose, glue pasted: this log's name, span (in UTC) and clients, nothing of the example.
    for words in (
        "This run plans shop-access.log.",
        f"shop-access.log holds requests from {first} to {last} UTC, from {len(clients):,} "
        "clients counted by client address.",
        f"Of its {len(sent):,} lines, 0 could not be read.",
    ):
        assert words in page
    assert CRAWLER in page.split("Who sends how fast")[1]  # the busiest, in the demand table
    for example_only in ("{glue", "{term}", "two servers", "Zipf distribution on purpose"):
        assert example_only not in page
    assert (out / "08_your_traffic.kernel.log").exists()


def test_make_plan_refuses_a_missing_log_in_one_line(tmp_path):
    missing = tmp_path / "nowhere.log"
    done = _make_plan(f"LOG={missing}", "LIMIT=60/min", f"PLAN_DIR={tmp_path / 'plan'}")
    assert done.returncode != 0
    assert _ours(done.stderr) == [f"make plan: error: cannot read {missing}: no such file"]


def test_make_plan_refuses_a_bad_limit_in_one_line(tmp_path):
    log = tmp_path / "access.log"
    _combined_log(log)
    done = _make_plan(f"LOG={log}", "LIMIT=10/fortnight", f"PLAN_DIR={tmp_path / 'plan'}")
    assert done.returncode != 0
    [line] = _ours(done.stderr)
    assert line.startswith("make plan: error: LIMIT='10/fortnight': ") and "fortnight" in line[40:]
    assert not (tmp_path / "plan").exists()  # refused before anything ran


@pytest.mark.timeout(600)
def test_a_log_with_no_request_to_plan_is_one_line_not_a_traceback(tmp_path):
    pytest.importorskip("papermill")
    log = tmp_path / "access.log"
    sent = _combined_log(log)  # its user field is "-" on every line: no identity there
    done = subprocess.run(
        [str(PYTHON), str(TOOL), "--out", str(tmp_path / "plan"), "--log", str(log),
         "--limit", "60/min", "--identity", "user"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("make plan: error: no requests to plan in access.log: ")
    assert f"{len(sent):,} of {len(sent):,} lines skipped: {len(sent):,} no identity" in line
    assert not (tmp_path / "plan" / "08_your_traffic.html").exists()


def test_paste_formats_glue_as_the_book_does_and_keeps_a_terms_words():
    values = {"share": "0.3361", "lines": "32084", "name": "'apache_logs'"}
    text = (
        "{glue:text}`lines:,d` lines of {glue:text}`name`; {glue:text}`share:.1%` rejected "
        "under the {term}`sliding log` ({term}`GCRA <token bucket>`)"
    )
    assert plan_page.paste(text, values) == (
        "32,084 lines of apache_logs; 33.6% rejected under the sliding log (GCRA)"
    )
