"""Chapter 4's module: the lab it runs on, the race, the steady client that the
add-then-count MULTI/EXEC locks out, the duplicate member, the replays with flushes and
restarts, the outage and freeze tables, and the Explore figure."""

from __future__ import annotations

import asyncio
import inspect
import itertools
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from ratelimit import algorithms, scripts  # noqa: E402
from ratelimit.clock import ManualClock  # noqa: E402
from ratelimit.decision import Decision  # noqa: E402
from ratelimit.devtools.process import pid_alive  # noqa: E402
from ratelimit.devtools.server import RedisServer  # noqa: E402
from ratelimit.lab import records, traffic  # noqa: E402
from ratelimit.lab.chapters import atomicity_and_failures as atomicity  # noqa: E402
from ratelimit.lab.classic import ClassicSlidingLog, ClassicTransactionLog  # noqa: E402
from ratelimit.lab.plotting import explorer  # noqa: E402

RECORDS = Path(__file__).parents[2] / "notebooks" / "data" / "records"
PHASES = {"running": 2, "stopped": 2, "running again": 1}


@pytest.fixture
async def lab():
    """Every section on the embedded fakeredis, whatever REDIS_URL says."""
    lab = atomicity.Lab(shared=False, private=False).start()
    yield lab
    await lab.aclose()


@pytest.fixture
async def private_lab():
    """Sections 3-5 on a private redis-server (with its append-only file)."""
    if not RedisServer.available():
        pytest.skip("redis-server is not installed")
    lab = atomicity.Lab(shared=False, private=True).start()
    yield lab
    await lab.aclose()


@pytest.fixture(scope="module")
def trace():
    return traffic.poisson(30.0, 6.0, seed=4)


def bars(ax) -> list[tuple[float, float]]:
    """(left edge, height) of every non-empty histogram bar of one axes."""
    return [(p.get_x(), p.get_height()) for p in ax.patches if p.get_height() > 0]


def lines_of(ax) -> dict[str, list[float]]:
    """The y values of every line of one axes, by label."""
    return {line.get_label(): np.asarray(line.get_ydata()).tolist() for line in ax.get_lines()}


def fake_clients():
    """A synchronous and an asyncio client of one new fakeredis server."""
    import fakeredis

    server = fakeredis.FakeServer()
    return fakeredis.FakeRedis(server=server), fakeredis.FakeAsyncRedis(server=server)


# --- the lab ------------------------------------------------------------------------------


async def test_embedded_lab_starts_no_server_and_says_so(lab):
    assert not lab.race.real and not lab.target.real and lab.pids() == []
    assert "embedded fakeredis" in lab.describe() and "127.0.0.1" not in lab.describe()
    lab.sync_client(lab.race).set(f"{lab.prefix}:x", 1)
    assert lab.leftover_keys() == [f"{lab.prefix}:x"]
    lab.sync_client(lab.race).delete(f"{lab.prefix}:x")
    assert lab.leftover_keys() == []


async def test_private_lab_stops_every_server_it_started(private_lab):
    extra = private_lab.new_server()
    pids = private_lab.pids()
    assert len(pids) == 3 and all(pid_alive(pid) for pid in pids)  # race, target, extra
    assert private_lab.target.server.args == atomicity.APPEND_ONLY
    assert str(private_lab.target.server.port) not in private_lab.describe()
    await private_lab.aclose()
    assert not any(pid_alive(pid) for pid in pids) and not extra.running
    assert private_lab.clients == []


# --- section 1: the race ------------------------------------------------------------------


async def test_race_table_lua_admits_exactly_the_limit(lab):
    race = await atomicity.race_table(lab, concurrency=12, limit=5, window_s=1, rounds=3)
    assert len(race) == 6 * 3 and set(race.way) == set(atomicity.ways(12))
    assert set(race.limiter) == {atomicity.NON_ATOMIC, atomicity.MULTI, atomicity.LUA}
    lua = race[race.limiter == atomicity.LUA].admitted
    assert (lua == 5).all()
    # MULTI/EXEC is atomic: exactly the limit too, both ways.
    assert (race[race.limiter == atomicity.MULTI].admitted == 5).all()
    naive = race[(race.limiter == atomicity.NON_ATOMIC) & (race.way == "asyncio, one process")]
    assert (naive.admitted > 5).all()  # the embedded asyncio client interleaves every round
    assert lab.leftover_keys() == []  # each round's key was deleted


def test_race_threads_uses_the_sync_check_of_the_classic_recipe():
    import fakeredis

    client = fakeredis.FakeRedis()
    limiter = ClassicSlidingLog(client, 1, 3, prefix="t")
    counts = atomicity.race_threads(limiter, client, concurrency=6, rounds=2)
    assert len(counts) == 2 and all(3 <= n <= 6 for n in counts)
    assert list(client.scan_iter()) == []
    multi = ClassicTransactionLog(client, 1, 3, prefix="m", suffix=itertools.count().__next__)
    assert atomicity.race_threads(multi, client, concurrency=6, rounds=2) == [3, 3]
    assert list(client.scan_iter()) == []


async def test_race_on_a_real_redis_multi_and_lua_admit_exactly_the_limit(private_lab):
    race = await atomicity.race_table(private_lab, concurrency=20, limit=4, window_s=1, rounds=5)
    exact = race[race.limiter != atomicity.NON_ATOMIC]
    assert len(exact) == 2 * 2 * 5 and (exact.admitted == 4).all()
    assert (race[race.limiter == atomicity.NON_ATOMIC].admitted >= 4).all()
    assert private_lab.leftover_keys() == []


# --- section 1, continued: MULTI/EXEC counts what it rejects --------------------------------


async def test_the_transaction_log_sends_one_multi_exec_per_check():
    sync, aclient = fake_clients()
    clock = ManualClock(1_000.0)
    recipe = ClassicTransactionLog(sync, 1, 2, prefix="t", clock=clock)
    assert [recipe.check_sync("k") for _ in range(3)] == [True, True, False]
    # The rejected request was added too: the set holds all three.
    assert sync.zcard(recipe.key_for("k")) == 3
    assert 0 < sync.pttl(recipe.key_for("k")) <= 1_000
    a = ClassicTransactionLog(aclient, 1, 2, prefix="a", clock=clock)
    assert [await a.check("k") for _ in range(3)] == [True, True, False]
    assert sync.zcard(a.key_for("k")) == 3


async def test_check_transaction_sync_decides_like_the_asyncio_form():
    sync, aclient = fake_clients()
    clock = ManualClock(1_000.0)
    s = ClassicSlidingLog(sync, 1, 3, prefix="s", clock=clock)
    a = ClassicSlidingLog(aclient, 1, 3, prefix="a", clock=clock)
    got_sync, got_async = [], []
    for step in [0, 0.2, 0.2, 0.2, 0.5, 0.301, 1.0]:
        clock.advance(step)
        got_sync.append(s.check_transaction_sync("k"))
        got_async.append(await a.check_transaction("k"))
    assert got_sync == got_async
    # At 1100 ms the requests at 200, 400 and the rejected one at 600 still count; at
    # 1401 ms only 600 and 1100 do (both rejected), so there is room again.
    assert got_sync == [True, True, True, False, False, True, True]


def test_steady_times_are_evenly_spaced_whole_ms():
    assert atomicity.steady_times_ms(20, 1).tolist() == list(range(0, 1000, 50))
    times = atomicity.steady_times_ms(11, 10)
    assert len(times) == 110 and times[-1] < 10_000
    assert set(times[1:] - times[:-1]) <= {90, 91}
    assert len(atomicity.steady_times_ms(0.5, 10)) == 5
    with pytest.raises(ValueError, match="positive"):
        atomicity.steady_times_ms(0, 10)


@pytest.mark.parametrize(
    ("rate", "limit", "window_s"), [(5, 10, 1), (10, 10, 1), (11, 10, 1), (20, 10, 1), (3, 4, 2)]
)
async def test_steady_client_on_fakeredis_matches_the_model(rate, limit, window_s):
    _, aclient = fake_clients()
    steady = await atomicity.steady_client(
        aclient, rate=rate, limit=limit, window_s=window_s, duration_s=5 * window_s
    )
    model = atomicity.steady_model(rate=rate, limit=limit, window_s=window_s,
                                   duration_s=5 * window_s)  # fmt: skip
    pd.testing.assert_frame_equal(steady, model)
    assert steady.columns.tolist() == ["t (ms)", "limiter", "admitted"]
    assert [k async for k in aclient.scan_iter()] == []  # its keys are deleted
    await aclient.aclose()


def test_above_the_limit_multi_exec_locks_the_client_out():
    runs = {rate: atomicity.steady_model(rate=rate, limit=10, window_s=1, duration_s=10)
            for rate in (5, 10, 11, 20)}  # fmt: skip
    table = atomicity.steady_table(runs, limit=10, window_s=1)
    assert table.index.tolist() == ["5/s", "10/s", "11/s", "20/s"]
    assert table["requests sent"].tolist() == [50, 100, 110, 200]
    assert table["the limit allows (limit x windows)"].tolist() == [100] * 4
    lua, multi = atomicity.LUA, atomicity.MULTI
    # Up to the limit both admit every request; above it the script admits the limit
    # in every window, MULTI/EXEC one window's worth and then nothing.
    assert table[f"{lua}: admitted"].tolist() == [50, 100, 100, 100]
    assert table[f"{multi}: admitted"].tolist() == [50, 100, 10, 10]
    assert table[f"{multi}: after the first window"].tolist() == [45, 90, 0, 0]
    per_window = atomicity.steady_windows(runs[20], window_s=1)
    assert per_window.index.tolist() == list(range(10))
    assert per_window[lua].tolist() == [10] * 10
    assert per_window[multi].tolist() == [10] + [0] * 9


def test_the_model_of_add_then_count_records_rejections():
    # Limit 2 per 100 ms: the third request is rejected but recorded, so at 101 ms the
    # set still holds two requests of the last 100 ms and the fourth is rejected too.
    assert atomicity._add_then_count(np.array([0, 10, 20, 101]), 2, 100) == [
        True, True, False, False
    ]  # fmt: skip
    # Once a whole window has passed with no request, the set is empty again.
    assert atomicity._add_then_count(np.array([0, 10, 20, 121]), 2, 100)[-1]


async def test_steady_clients_on_a_real_redis_match_the_model(private_lab):
    client = private_lab.async_client(private_lab.race)
    runs = await atomicity.steady_clients(
        client, rates=[10, 20], limit=5, window_s=1, duration_s=3,
        prefix=f"{private_lab.prefix}:steady",
    )  # fmt: skip
    assert list(runs) == [10, 20]
    for rate, steady in runs.items():
        model = atomicity.steady_model(rate=rate, limit=5, window_s=1, duration_s=3)
        pd.testing.assert_frame_equal(steady, model)
    assert private_lab.leftover_keys() == []


def test_steady_figure_draws_the_windows():
    steady = atomicity.steady_model(rate=20, limit=10, window_s=1, duration_s=4)
    fig = atomicity.steady_figure(steady, rate=20, limit=10, window_s=1)
    (ax,) = fig.axes
    lines = lines_of(ax)
    assert lines[atomicity.LUA] == [10] * 4 and lines[atomicity.MULTI] == [10, 0, 0, 0]
    assert "20/s" in ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    plt.close(fig)


def test_race_summary_counts_rounds_over_the_limit():
    race = pd.DataFrame({
        "way": ["a"] * 3 + ["b"] * 3,
        "limiter": ["x"] * 3 + ["y"] * 3,
        "round": [0, 1, 2] * 2,
        "admitted": [10, 12, 30, 10, 10, 10],
    })  # fmt: skip
    summary = atomicity.race_summary(race, limit=10)
    assert summary.loc[("a", "x")].tolist() == [10, 12, 30, 2]
    assert summary.loc[("b", "y"), "rounds over the limit"] == 0


def test_race_figure_draws_one_panel_per_way_with_the_counts():
    race = pd.DataFrame({
        "way": ["w1"] * 4 + ["w2"] * 4,
        "limiter": [atomicity.NON_ATOMIC, atomicity.NON_ATOMIC, atomicity.LUA, atomicity.LUA] * 2,
        "round": [0, 1] * 4,
        "admitted": [7, 8, 3, 3, 5, 5, 3, 3],
    })  # fmt: skip
    fig = atomicity.race_figure(race, concurrency=8, limit=3, window_s=1, where="somewhere")
    first, second = fig.axes
    assert [first.get_title(), second.get_title()] == ["w1", "w2"]
    assert sorted(bars(first)) == [(2.5, 2), (6.5, 1), (7.5, 1)]
    assert sorted(bars(second)) == [(2.5, 2), (4.5, 2)]
    assert "somewhere" in fig._suptitle.get_text() and first.get_ylabel() == "rounds (of 2)"
    assert atomicity.MULTI not in first.get_legend_handles_labels()[1]  # not in the data
    plt.close(fig)
    # MULTI/EXEC, outlined over the script's bar of the same height.
    multi = race[race.limiter == atomicity.LUA].assign(limiter=atomicity.MULTI)
    fig = atomicity.race_figure(pd.concat([race, multi]), concurrency=8, limit=3, window_s=1,
                                where="somewhere")  # fmt: skip
    first = fig.axes[0]
    assert sorted(bars(first)) == [(2.5, 2), (2.5, 2), (6.5, 1), (7.5, 1)]
    outlined = [p for p in first.patches if not p.get_fill()]
    assert [(p.get_x(), p.get_height()) for p in outlined] == [(2.5, 2)]
    plt.close(fig)


# --- section 2: the duplicate member --------------------------------------------------------


async def test_duplicate_members_classic_loses_one_ours_counts_both(lab):
    table = await atomicity.duplicate_members(lab, window_s=1, limit=10)
    classic, ours = table.index
    assert table["requests admitted"].tolist() == [2, 2]
    assert table.ZCARD.tolist() == [1, 2] and table["requests lost"].tolist() == [1, 0]
    assert table.loc[classic, "members in the set"] == "1796000000123:1"
    assert len(table.loc[ours, "members in the set"].split(", ")) == 2
    assert lab.leftover_keys() == []


# --- section 3: NOSCRIPT ------------------------------------------------------------------


def test_script_sha_is_the_one_redis_caches():
    import fakeredis

    client = fakeredis.FakeRedis()
    limiter = algorithms.SLIDING_LOG.build("sync", client, 1, 10)
    source = limiter.script
    assert source.startswith("local window = 1000\n") and scripts.source("sliding_log") in source
    assert atomicity.script_sha(limiter) == client.script_load(source) == limiter.script_sha


async def test_flushes_empty_the_cache_and_change_no_decision(lab, trace):
    control = atomicity.replay_undisturbed(lab, trace, limit=10, window_s=1)
    model = atomicity.replay_model(trace, limit=10, window_s=1)
    assert atomicity.decisions_changed(control, model) == 0
    flushed = atomicity.replay_with_flushes(lab, trace, [2.0, 4.0], limit=10, window_s=1)
    assert flushed.cached_after == [False, False] and flushed.cached_later == [True] * 3
    assert flushed.reloaded
    table = atomicity.replay_table({"flushed": flushed.decisions}, control, window_s=1)
    assert table.loc["flushed"].tolist() == [len(trace), control.allowed.sum(), 0, 0, 0, 10]
    assert lab.leftover_keys() == []


async def test_a_disturbance_that_keeps_the_script_is_not_a_reload(lab, trace):
    client = lab.sync_client(lab.target)
    kept = atomicity.replay_with_disturbances(
        client, trace, [3.0], lambda: None, limit=10, window_s=1, prefix=f"{lab.prefix}:k"
    )
    assert kept.cached_after == [True] and not kept.reloaded


def test_decisions_changed_counts_rows_and_refuses_other_requests():
    a = pd.DataFrame({"allowed": [True, True, False], "retry_after_ms": [0, 0, 500]})
    b = pd.DataFrame({"allowed": [True, False, False], "retry_after_ms": [0, 900, 400]})
    assert atomicity.decisions_changed(a, b) == 2
    with pytest.raises(ValueError, match="same requests"):
        atomicity.decisions_changed(a, b.iloc[:2])


async def test_restarts_need_a_private_server(lab, trace):
    with pytest.raises(ValueError, match="private redis-server"):
        atomicity.restart_replays(lab, trace, restart_at_s=3.0, limit=10, window_s=1)


async def test_a_restart_keeps_the_data_only_with_persistence(private_lab, trace):
    control = atomicity.replay_undisturbed(private_lab, trace, limit=10, window_s=1)
    runs = atomicity.restart_replays(private_lab, trace, restart_at_s=3.0, limit=10, window_s=1)
    table = atomicity.replay_table(
        {name: run.decisions for name, run in runs.items()}, control, window_s=1
    )
    kept, emptied = table.index
    assert "append-only" in kept and all(run.reloaded for run in runs.values())
    assert table.loc[kept, "decisions changed"] == 0
    assert table.loc[emptied, "decisions changed"] > 0
    assert table.loc[emptied, "most admitted in 1 s"] > 10
    assert private_lab.leftover_keys() == []
    assert len(private_lab.pids()) == 2  # the server without persistence is stopped again


# --- sections 4 and 5: down and frozen --------------------------------------------------------


@pytest.mark.parametrize(
    ("decision", "answer"),
    [
        (Decision(True, 5, 4, 0, 1000), "200"),
        (Decision(True, 5, 0, 0, 0, degraded=True), "200, degraded"),
        (Decision(False, 5, 0, 50_500, 60_000), "429, Retry-After: 51"),
        (Decision(False, 5, 0, 1000, 1000, degraded=True), "503, Retry-After: 1"),
    ],
)
def test_http_answer_follows_the_http_layer(decision, answer):
    assert atomicity.http_answer(decision) == answer


async def test_outage_steps_apply_each_policy_while_stopped(lab):
    down = atomicity.policy_limiters(lab, limit=3, window_s=60, timeout_s=0.5)
    steps = await atomicity.outage_steps(lab, down, PHASES)
    assert len(steps) == 5 * 3 and steps["t (s)"].max() == 5
    stopped = steps[steps.Redis == "stopped"].set_index("policy")
    assert stopped.loc["raise", "cause"].tolist() == ["ConnectionError"] * 2
    assert stopped.loc["allow", "HTTP"].tolist() == ["200, degraded"] * 2
    assert stopped.loc["deny", "HTTP"].tolist() == ["503, Retry-After: 1"] * 2
    assert not steps[steps.Redis != "stopped"].degraded.any()
    assert atomicity.http_table(steps).columns.tolist() == list(atomicity.POLICIES)

    table = atomicity.policy_table(steps, budget=3, timeout_s=0.5, margin_s=1000)
    assert table["admitted in all (budget 3)"].tolist() == [3, 5, 3]
    assert table["warnings logged"].tolist() == [0, 2, 2]
    assert (table["each check took"] == "within timeout + margin").all()
    slow = atomicity.policy_table(steps.assign(seconds=9.0), budget=3, timeout_s=0.5, margin_s=1)
    assert (slow["each check took"] == "too long").all()
    assert await atomicity.delete_keys(down) == 3 and lab.leftover_keys() == []


async def test_outage_steps_refuse_other_phases(lab):
    down = atomicity.policy_limiters(lab)
    with pytest.raises(ValueError, match="phases"):
        await atomicity.outage_steps(lab, down, {"stopped": 1})


async def test_policy_table_refuses_a_phase_whose_checks_disagree(lab):
    down = atomicity.policy_limiters(lab, limit=3, window_s=60, timeout_s=0.5)
    steps = await atomicity.outage_steps(lab, down, PHASES)
    await atomicity.delete_keys(down)
    odd = steps.copy()
    odd.loc[(odd.Redis == "stopped") & (odd.policy == "allow"), "HTTP"] = ["200", "201"]
    with pytest.raises(ValueError, match="disagree"):
        atomicity.policy_table(odd, budget=3, timeout_s=0.5, margin_s=0.5)


async def test_frozen_checks_on_a_silent_socket_give_up_and_apply_the_policy(lab):
    down = atomicity.policy_limiters(lab, limit=3, window_s=60, timeout_s=0.05)
    frozen = await atomicity.frozen_checks(lab, down)
    assert frozen.index.tolist() == list(atomicity.POLICIES)
    assert frozen.cause.tolist() == ["TimeoutError", "", ""]
    assert frozen.admitted.tolist() == [False, True, False] and frozen.degraded.all()
    assert frozen.warnings.tolist() == [0, 1, 1]
    assert not (await atomicity.thawed_checks(down)).degraded.any()
    await atomicity.delete_keys(down)


async def test_frozen_checks_pause_the_private_server_and_it_answers_after(private_lab):
    down = atomicity.policy_limiters(private_lab, limit=3, window_s=60, timeout_s=0.2)
    frozen = await atomicity.frozen_checks(private_lab, down)
    assert frozen.cause["raise"] == "TimeoutError"
    assert frozen.HTTP.tolist() == ["503, Retry-After: 1", "200, degraded", "503, Retry-After: 1"]
    assert not (await atomicity.thawed_checks(down)).degraded.any()
    assert await atomicity.delete_keys(down) > 0 and private_lab.leftover_keys() == []


def test_frozen_table_names_each_checks_duration():
    frozen = pd.DataFrame(
        {"outcome": ["a", "b", "c"], "HTTP": ["x", "y", "z"], "seconds": [0.2, 0.495, 1.5]},
        index=pd.Index(list(atomicity.POLICIES), name="policy"),
    )
    table = atomicity.frozen_table(frozen, timeout_s=0.5, margin_s=0.5)
    assert table["the check took"].tolist() == [
        "unexpected", "about the timeout (within timeout + margin)", "unexpected"
    ]  # fmt: skip
    assert table["HTTP answer"].tolist() == ["x", "y", "z"]


# --- Explore ------------------------------------------------------------------------------


def test_figure_is_titled_and_labelled():
    fig = atomicity.figure()
    assert isinstance(fig, Figure)
    race, steady = fig.axes
    for ax in (race, steady):
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    labels = race.get_legend_handles_labels()[1]
    limiters = [atomicity.NON_ATOMIC, atomicity.LUA, atomicity.MULTI]
    assert sorted(labels) == sorted(["limit (10)", *limiters])
    assert sorted(steady.get_legend_handles_labels()[1]) == sorted(
        ["limit (10)", atomicity.LUA, atomicity.MULTI]
    )
    assert "20/s" in steady.get_title()  # twice the limit, by default
    plt.close(fig)


def test_defaults_tell_the_chapter_story():
    counts = atomicity.race_counts()
    assert counts[atomicity.NON_ATOMIC] == [50] * 100  # every request got in, every round
    assert counts[atomicity.MULTI] == [10] * 100  # atomic: exactly the limit
    assert counts[atomicity.LUA] == [10] * 100  # exactly the limit, every round
    fig = atomicity.figure()
    lines = lines_of(fig.axes[1])
    assert lines[atomicity.LUA] == [10] * 10  # the script: the limit in every window
    assert lines[atomicity.MULTI] == [10] + [0] * 9  # MULTI/EXEC: locked out after one
    plt.close(fig)


def test_a_parameter_change_changes_the_bars():
    default, fewer = atomicity.figure(), atomicity.figure(concurrency=20, rounds=30)
    # All rounds at 50 (non-atomic) and at 10 (Lua, and MULTI/EXEC outlined over it),
    # then at 20 and 10.
    assert sorted(bars(default.axes[0])) == [(9.5, 100), (9.5, 100), (49.5, 100)]
    assert sorted(bars(fewer.axes[0])) == [(9.5, 30), (9.5, 30), (19.5, 30)]
    plt.close(default)
    plt.close(fewer)
    at_the_limit = atomicity.figure(rate_multiple=1, rounds=5)
    lines = lines_of(at_the_limit.axes[1])
    assert lines[atomicity.MULTI] == [10] * 10  # no rejection, nothing to hold against it
    plt.close(at_the_limit)


def test_below_the_limit_all_admit_everything():
    counts = atomicity.race_counts(concurrency=5, limit=10, rounds=5)
    assert counts == {
        atomicity.NON_ATOMIC: [5] * 5, atomicity.MULTI: [5] * 5, atomicity.LUA: [5] * 5
    }  # fmt: skip


@pytest.mark.parametrize(
    "params",
    [
        {"concurrency": 12, "limit": 10, "rounds": 3},
        {"concurrency": 8, "limit": 10, "rounds": 2},
        {"concurrency": 20, "limit": 1, "rounds": 2},
    ],
)
def test_in_memory_race_matches_the_embedded_backend(params):
    embedded = asyncio.run(atomicity.embedded_counts(**params))
    assert atomicity.race_counts(**params) == embedded


def test_sliders_redraw_the_figure():
    calls = []

    def draw(**values):
        calls.append(values)
        return atomicity.figure(**values)

    draw.__signature__ = inspect.signature(atomicity.figure)  # its defaults start the sliders
    widget = explorer(draw, concurrency=(2, 100), limit=(1, 50), rounds=(5, 100))
    assert calls == [{"concurrency": 50, "limit": 10, "rounds": 100}]  # the defaults
    widget.children[2].value = 20
    assert calls[-1] == {"concurrency": 50, "limit": 10, "rounds": 20}
    assert [c.description for c in widget.children[:3]] == ["concurrency", "limit", "rounds"]
    plt.close("all")


def test_the_readme_texts_quote_what_the_module_computes():
    # The committed records are what the README quotes: every field of the texts is
    # recorded, and the in-memory race and steady client give the same numbers.
    values = records.load("04_atomicity_and_failures", RECORDS)["values"]
    for template in (atomicity.SUMMARY, atomicity.HEADLINE):
        assert records.fill(template, values, "atomicity_and_failures")
    recorded = {name: v["value"] for name, v in values.items()}
    concurrent, limit, rounds = recorded["concurrent"], recorded["limit"], recorded["rounds"]
    counts = atomicity.race_counts(concurrency=concurrent, limit=limit, rounds=rounds)
    assert counts[atomicity.NON_ATOMIC] == [recorded["naive_embedded_admitted"]] * rounds
    assert (
        counts[atomicity.MULTI]
        == counts[atomicity.LUA]
        == [recorded["atomic_race_admitted"]] * rounds
    )
    rate, duration_s = recorded["steady_rate"], recorded["steady_duration_s"]
    steady = atomicity.steady_model(rate=rate, limit=limit, window_s=1, duration_s=duration_s)
    table = atomicity.steady_table({rate: steady}, limit=limit, window_s=1).iloc[0]
    assert table["requests sent"] == recorded["steady_sent"]
    assert table[f"{atomicity.LUA}: admitted"] == recorded["steady_lua_admitted"]
    assert table[f"{atomicity.MULTI}: admitted"] == recorded["steady_multi_admitted"]
    assert (
        table[f"{atomicity.MULTI}: after the first window"] == recorded["steady_multi_after_first"]
    )
