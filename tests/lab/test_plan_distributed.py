"""Many logs planned as one (`planner.sources`), and the same plan on Dask
(`planner.distributed`): the merged plan equals the plan of the sorted concatenation,
and the Dask engine's JSON equals the local engine's."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from ratelimit.lab import __main__ as cli
from ratelimit.lab import accesslog
from ratelimit.lab.planner import sources

LIMITS = ["5/s", "30/min"]
START = 1_700_000_000.0


def _line(
    t: float, client: str, status: int = 200, agent: str = "gen/1.0", whole: bool = False
) -> str:
    stamp = datetime.fromtimestamp(t, UTC)
    when = stamp.strftime("%d/%b/%Y:%H:%M:%S")
    when += " +0000" if whole else f".{stamp.microsecond // 1000:03d} +0000"
    return f'{client} - - [{when}] "GET /tile/{int(t) % 7} HTTP/1.1" {status} 512 "-" "{agent}"'


def _requests(seed: int, n: int = 3_000) -> list[tuple[float, str, int]]:
    """(time, client, server): bursty clients, whole ms, spread over three servers."""
    rng = np.random.default_rng(seed)
    clients = [f"10.0.{i // 250}.{i % 250}" for i in range(12)]
    weights = rng.dirichlet(np.ones(len(clients)) * 0.6)
    times = START + np.sort(rng.uniform(0, 600, n))
    times = np.round(times, 3)
    who = rng.choice(len(clients), n, p=weights)
    server = rng.integers(0, 3, n)
    return [(float(t), clients[c], int(s)) for t, c, s in zip(times, who, server, strict=True)]


def _shuffled_a_little(lines: list[tuple[float, str]], rng: np.random.Generator, late: int):
    """Swap neighbours (a few seconds out of order) and move `late` lines far back."""
    out = list(lines)
    for i in rng.integers(0, len(out) - 1, len(out) // 20):
        out[i], out[i + 1] = out[i + 1], out[i]
    for i in rng.integers(len(out) // 2, len(out), late):
        out.insert(i - 40, out.pop(i))  # logged a few tens of seconds after its time
    return out


def write_logs(
    folder: Path, seed: int = 3, late: int = 0, whole: bool = False
) -> list[tuple[float, str]]:
    """Three servers' logs, server 0 rotated in two (the older one gzipped), one
    malformed line; returns every (time, line) written. `whole`: stamps in whole
    seconds, and each client's user agent varies (the busier ones have several)."""
    rng = np.random.default_rng(seed + 1)
    written = []
    for server in range(3):
        mine = [
            (t, _line(t, c, agent=_agent(c, t) if whole else "gen/1.0", whole=whole))
            for t, c, s in _requests(seed)
            if s == server
        ]
        mine = _shuffled_a_little(mine, rng, late)
        written += mine
        texts = [text for _, text in mine]
        if server == 0:
            texts.insert(10, "not a log line at all")
            half = len(texts) // 2
            with gzip.open(folder / "access.log.1.gz", "wt") as out:
                out.write("\n".join(texts[:half]) + "\n")
            (folder / "access.log").write_text("\n".join(texts[half:]) + "\n")
        else:
            (folder / f"edge{server}.log").write_text("\n".join(texts) + "\n")
    return written


def _agent(client: str, t: float) -> str:
    """A user agent that depends on the client and, for some, on the time."""
    k = int(client.rsplit(".", 1)[1])
    return f"bot-{k % 3}/{int(t) % (k % 4 + 1)}.0" if k % 2 else "-"


def _comparable(plan) -> dict:
    """A plan's JSON without where its lines came from (paths, example excerpts)."""
    doc = plan.to_dict()
    doc["log"].pop("path")
    problems = doc["log"].pop("problems")
    doc["log"]["counts"] = (problems["lines"], problems["parsed"], problems["counts"])
    return doc


def test_many_logs_plan_as_their_sorted_concatenation(tmp_path: Path) -> None:
    written = write_logs(tmp_path)
    merged = sources.plan_logs([str(tmp_path / "*.log*")], LIMITS, measure=False)
    whole = tmp_path / "sorted" / "all.log"
    whole.parent.mkdir()
    ordered = sorted(written, key=lambda row: row[0])
    whole.write_text("not a log line at all\n" + "\n".join(t for _, t in ordered) + "\n")
    single = sources.plan_logs(whole, LIMITS, measure=False)
    assert merged.log.requests == len(written)
    assert merged.log.problems.counts == {"malformed": 1}
    assert sum(c.rejected for c in merged.candidates) > 0
    assert _comparable(merged) == _comparable(single)
    assert "4 more" not in merged.log.path and "edge1.log" in merged.log.path


def test_one_log_plans_as_plan_log(tmp_path: Path) -> None:
    write_logs(tmp_path)
    from ratelimit.lab import planner

    one = sources.plan_logs(tmp_path / "edge1.log", LIMITS, measure=False)
    expected = planner.plan_log(tmp_path / "edge1.log", LIMITS, measure=False)
    assert one.to_dict() == expected.to_dict()


@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    ) as running:
        yield running


@pytest.mark.parametrize("reorder_s", [300.0, 1.0])
def test_dask_engine_gives_the_local_engines_json(tmp_path: Path, cluster, reorder_s) -> None:
    write_logs(tmp_path, seed=5, late=6)
    options = dict(measure=False, reorder_s=reorder_s, chunk_lines=700)
    logs = [str(tmp_path / "access.log*"), str(tmp_path / "edge*.log")]
    local = sources.plan_logs(logs, LIMITS, **options)
    on_dask = sources.plan_logs(
        logs, LIMITS, engine="dask", scheduler=cluster.scheduler_address, partitions=3,
        **options,
    )  # fmt: skip
    if reorder_s < 30:  # lines moved tens of seconds are late: decided where they arrive
        assert local.log.problems.late > 0
    assert local.log.problems.lines == on_dask.log.problems.lines > 0
    assert max(c.redis.keys for c in local.candidates) > 1
    assert on_dask.to_dict() == local.to_dict()


def test_dask_engine_agrees_on_every_answer_of_a_coarse_late_log(tmp_path: Path, cluster) -> None:
    # Whole-second stamps (a 1 s window is replayed with the stamps spread), late lines,
    # several user agents per client, and a share no limit reaches for some algorithms.
    write_logs(tmp_path, seed=6, late=10, whole=True)
    options = dict(measure=False, reorder_s=1.0, chunk_lines=500, affect=0.0)
    logs = [str(tmp_path / "*.log*")]
    local = sources.plan_logs(logs, LIMITS, **options)
    on_dask = sources.plan_logs(
        logs, LIMITS, engine="dask", scheduler=cluster.scheduler_address, partitions=4,
        **options,
    )  # fmt: skip
    assert local.log.resolution_ms == 1_000 and local.log.problems.late > 0
    assert any(c.stamps is not None and c.stamps.rejected_spread is not None
               for c in local.candidates)  # fmt: skip
    assert len({o.agent for c in local.candidates for o in c.offenders}) > 2
    assert sum(sum(c.rejected_by_hour) for c in local.candidates) > 0
    assert any(c.longest_throttled for c in local.candidates) and local.recommended
    assert on_dask.to_dict() == local.to_dict()
    assert on_dask.table() == local.table()


def test_partitions_are_the_same_in_every_process() -> None:
    script = (
        "from ratelimit.lab.planner.distributed import partition_of; import numpy as np; "
        "print(partition_of(np.array([f'client-{i}' for i in range(200)], dtype=object), 3)"
        ".tolist())"
    )
    seen = []
    for seed in ("1", "2"):  # Python's own str hash differs between these two
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, check=True)  # fmt: skip
        seen.append(done.stdout)
    assert seen[0] == seen[1]
    assert set(json.loads(seen[0])) == {0, 1, 2}


def test_cli_plans_a_glob(tmp_path: Path, capsys) -> None:
    write_logs(tmp_path)
    out = tmp_path / "plan.json"
    code = cli.main(["plan", str(tmp_path / "*.log*"), "--limit", "5/s", "--no-measure",
                     "--no-progress", "--json", str(out)])  # fmt: skip
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["log"]["requests"] == 3_000


def test_cli_names_a_pattern_that_matches_nothing(tmp_path: Path, capsys) -> None:
    code = cli.main(["plan", str(tmp_path / "nothing*.log"), "--no-measure"])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.count("\n") == 0 and "no file matches" in err


def test_a_file_that_is_not_a_log_fails_before_reading(tmp_path: Path) -> None:
    write_logs(tmp_path)
    (tmp_path / "notes.log").write_text("\x00\x01 binary\n" * 50)
    with pytest.raises(accesslog.LogFormatError):
        sources.plan_logs([str(tmp_path / "*.log")], LIMITS, measure=False)
