"""server_cost's arithmetic: INFO commandstats deltas, top-level commands only, per
check, per round and summed over rounds; no server needed (a fake one counts)."""

from __future__ import annotations

import statistics

import pytest

from bench import server_cost
from bench.server_cost import CostCase


def test_server_cost_counts_top_level_commands_only() -> None:
    before = {"evalsha": {"calls": 5, "usec": 50}, "zadd": {"calls": 0, "usec": 0}}
    after = {
        "evalsha": {"calls": 15, "usec": 250},
        "zadd": {"calls": 10, "usec": 40},  # inside the scripts: already in evalsha's time
        "info": {"calls": 1, "usec": 99},
    }
    out = server_cost.per_check(before, after, 10)
    assert out["usec_per_check"] == 20 and out["top_level_commands_per_check"] == 1
    assert out["commands"]["zadd"]["nested"] is True and "info" not in out["commands"]
    assert out["commands"]["evalsha"] == {
        "calls_per_check": 1.0,
        "usec_per_check": 20.0,
        "nested": False,
    }
    plain = server_cost.per_check({}, {"ping": {"calls": 4, "usec": 2}}, 4)
    assert plain["usec_per_check"] == 0.5 and plain["top_level_commands_per_check"] == 1


def test_a_transaction_counts_multi_and_exec() -> None:
    after = {
        "multi": {"calls": 10, "usec": 10},
        "exec": {"calls": 10, "usec": 300},
        "zadd": {"calls": 10, "usec": 100},
        "zcard": {"calls": 10, "usec": 50},
    }
    out = server_cost.per_check({}, after, 10)
    assert out["usec_per_check"] == 31 and out["top_level_commands_per_check"] == 2
    assert {n for n, c in out["commands"].items() if c["nested"]} == {"zadd", "zcard"}


def test_deltas_add_up_over_rounds() -> None:
    one = {"evalsha": {"calls": 10, "usec": 100}}
    two = {"evalsha": {"calls": 10, "usec": 300}, "get": {"calls": 10, "usec": 10}}
    total = server_cost.add(server_cost.add({}, one), two)
    assert total == {"evalsha": {"calls": 20, "usec": 400}, "get": {"calls": 10, "usec": 10}}
    assert one == {"evalsha": {"calls": 10, "usec": 100}}  # the inputs are left alone
    out = server_cost.of_delta(total, 20)
    assert out["usec_per_check"] == 20 and out["commands"]["get"]["calls_per_check"] == 0.5
    # Nothing that ran for the bench itself is counted.
    bookkeeping = {"del": {"calls": 3, "usec": 9}, "scan": {"calls": 1, "usec": 1}}
    assert server_cost.delta({}, bookkeeping) == {}


class FakeServer:
    """Cumulative command statistics, as INFO commandstats reports them."""

    def __init__(self) -> None:
        self.stats: dict[str, dict[str, int]] = {}
        self.info_calls = 0

    def run(self, command: str, usec: int, calls: int = 1) -> None:
        mine = self.stats.setdefault(command, {"calls": 0, "usec": 0})
        mine["calls"] += calls
        mine["usec"] += usec

    async def info(self, section: str) -> dict:
        assert section == "commandstats"
        self.info_calls += 1
        self.run("info", 5)  # INFO counts itself: ignored
        return {f"cmdstat_{k}": dict(v) for k, v in self.stats.items()}


async def test_measure_takes_usec_per_check_per_round(monkeypatch) -> None:
    server = FakeServer()
    deleted = []

    async def delete_prefix(client, prefix: str) -> int:
        deleted.append(prefix)
        return 0

    monkeypatch.setattr(server_cost, "delete_prefix", delete_prefix)
    costs = iter([3, 2, 4, 5, 4])  # usec per call of "ours", round after round (+ warm-up)
    prepared = []

    async def ours(n: int) -> int:
        usec = next(costs)
        server.run("evalsha", usec * n, n)
        server.run("zadd", usec * n // 2, n)  # nested in the script
        return 0  # every check rejected

    async def prepare() -> None:
        prepared.append(len(server.stats))
        server.run("evalsha", 10_000, 100)  # filling the key: outside the snapshots

    async def floor(n: int) -> int:
        server.run("evalsha", 2 * n, n)
        return n

    cases = {"floor": CostCase("floor", floor), "ours": CostCase("reject", ours, prepare)}
    per_round, totals, admitted = await server_cost.measure(server, cases, 4, 10, "p")
    assert [r["ours"] for r in per_round] == [2.0, 4.0, 5.0, 4.0]  # 3 went to the warm-up
    assert [r["floor"] for r in per_round] == [2.0] * 4
    assert statistics.median(r["ours"] / r["floor"] for r in per_round) == 2.0
    assert len(prepared) == 5 and deleted == ["p"] * 4  # each round from an empty keyspace
    assert admitted == {"floor": 40, "ours": 0}
    summed = server_cost.of_delta(totals["ours"], 40)
    assert summed["usec_per_check"] == pytest.approx((2 + 4 + 5 + 4) / 4)
    assert summed["commands"]["zadd"]["nested"] is True
    assert summed["commands"]["evalsha"]["calls_per_check"] == 1.0
