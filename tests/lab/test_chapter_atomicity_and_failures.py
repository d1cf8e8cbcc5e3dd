"""Chapter 4's module: the lab it runs on, the race, the duplicate member, the replays
with flushes and restarts, the outage and freeze tables, and the Explore figure."""

from __future__ import annotations

import asyncio
import hashlib
import inspect

import matplotlib
import pandas as pd
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from ratelimit import algorithms, scripts  # noqa: E402
from ratelimit.decision import Decision  # noqa: E402
from ratelimit.devtools.process import pid_alive  # noqa: E402
from ratelimit.devtools.server import RedisServer  # noqa: E402
from ratelimit.lab import traffic  # noqa: E402
from ratelimit.lab.chapters import atomicity_and_failures as atomicity  # noqa: E402
from ratelimit.lab.classic import ClassicSlidingLog  # noqa: E402
from ratelimit.lab.plotting import explorer  # noqa: E402

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
    assert len(race) == 4 * 3 and set(race.way) == set(atomicity.ways(12))
    lua = race[race.limiter == atomicity.LUA].admitted
    assert (lua == 5).all()
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

    source = scripts.source(algorithms.SLIDING_LOG.script)
    assert atomicity.script_sha() == fakeredis.FakeRedis().script_load(source)
    assert atomicity.script_sha() == hashlib.sha1(source.encode()).hexdigest()


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
    (ax,) = fig.axes
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    labels = ax.get_legend_handles_labels()[1]
    assert sorted(labels) == sorted(["limit (10)", atomicity.NON_ATOMIC, atomicity.LUA])
    plt.close(fig)


def test_defaults_tell_the_chapter_story():
    counts = atomicity.race_counts()
    assert counts[atomicity.NON_ATOMIC] == [50] * 100  # every request got in, every round
    assert counts[atomicity.LUA] == [10] * 100  # exactly the limit, every round


def test_a_parameter_change_changes_the_bars():
    default, fewer = atomicity.figure(), atomicity.figure(concurrency=20, rounds=30)
    # One bar per limiter: all rounds at 50 (non-atomic) and at 10 (Lua), then at 20 and 10.
    assert sorted(bars(default.axes[0])) == [(9.5, 100), (49.5, 100)]
    assert sorted(bars(fewer.axes[0])) == [(9.5, 30), (19.5, 30)]
    plt.close(default)
    plt.close(fewer)


def test_below_the_limit_both_admit_everything():
    counts = atomicity.race_counts(concurrency=5, limit=10, rounds=5)
    assert counts == {atomicity.NON_ATOMIC: [5] * 5, atomicity.LUA: [5] * 5}


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
