"""The compiled replay decides as the reference models' `run`, and leaves their state.

Hypothesis draws traces over a few identities (ties, bursts, gaps past the window,
times stepping back as late requests do, costs up to the limit or burst, limits up to
50, windows up to 5 s) and compares every decision with the model's, whole and cut
into chunks, then the state each identity is left with.
"""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratelimit import algorithms
from ratelimit.lab import fastreplay, reference, rings, simulation
from ratelimit.lab.fastreplay import Codes, Replayer
from ratelimit.lab.timebase import seconds_to_ms

NAMES = [a.name for a in algorithms.ALGORITHMS]
IDENTITIES = ["a", "b", "c", "d"]
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def traces(draw, name: str | None = None):
    """(algorithm, options, codes, times_ms, costs): rows in decision order."""
    name = name or draw(st.sampled_from(NAMES))
    window_ms = draw(st.sampled_from([1, 7, 100, 1000]) | st.integers(1, 5000))
    limit = draw(st.integers(1, 50))
    options = {"limit": limit, "window_ms": window_ms}
    if name == "gcra":
        options["burst"] = draw(st.integers(1, 2 * limit))
    max_cost = min(limit, options.get("burst", limit))
    now = draw(st.sampled_from([0, 999, -5_000, 1_796_000_000_123]))
    gap = st.one_of(
        st.just(0),  # the same millisecond
        st.integers(1, 5),  # a burst
        st.integers(0, 2 * window_ms),  # ordinary spacing
        st.integers(-window_ms, -1),  # a late request
    )
    cost = st.integers(1, max_cost) if draw(st.booleans()) else st.just(1)
    steps = draw(
        st.lists(
            st.tuples(gap, cost, st.integers(0, len(IDENTITIES) - 1)), min_size=1, max_size=120
        )
    )
    codes, times, costs = [], [], []
    for step, c, who in steps:
        now += step
        codes.append(who)
        times.append(now)
        costs.append(c)
    return name, options, np.array(codes), np.array(times), np.array(costs)


def model_for(name: str, options: dict):
    return algorithms.get(name).build("reference", **options)


def by_the_model(model, codes, times, costs):
    """The specification: each identity's requests through the model's `run`."""
    n = len(codes)
    allowed, remaining, retry = np.zeros(n, bool), np.zeros(n, np.int64), np.zeros(n, np.int64)
    for code in np.unique(codes):
        rows = np.flatnonzero(codes == code)
        a, r, w, _ = model.run(
            IDENTITIES[code].encode(), times[rows].tolist(), costs[rows].tolist()
        )
        allowed[rows], remaining[rows], retry[rows] = a, r, w
    return allowed, remaining, retry


def assert_same(expected, actual) -> None:
    for name, e, a in zip(
        ("allowed", "remaining", "retry_after_ms"), expected, actual, strict=True
    ):
        np.testing.assert_array_equal(a, e, err_msg=name)


def replayer_for(name: str, options: dict) -> Replayer:
    return Replayer(name, options["limit"], options["window_ms"], burst=options.get("burst"))


@SETTINGS
@given(trace=traces(), data=st.data())
def test_decisions_chunks_and_state_match_the_model(trace, data):
    name, options, codes, times, costs = trace
    model = model_for(name, options)
    expected = by_the_model(model, codes, times, costs)

    whole = replayer_for(name, options)
    assert_same(expected, whole.decide(codes, times, costs))

    cuts = sorted(data.draw(st.lists(st.integers(0, len(codes)), max_size=4)))
    chunked = replayer_for(name, options)
    parts = [
        chunked.decide(codes[lo:hi], times[lo:hi], costs[lo:hi])
        for lo, hi in zip([0, *cuts], [*cuts, len(codes)], strict=True)
    ]
    assert_same(expected, [np.concatenate(column) for column in zip(*parts, strict=True)])

    for replayer in (whole, chunked):
        for code, who in enumerate(IDENTITIES):
            assert replayer.state(code) == model.state.get(who.encode()), who
        assert sorted(replayer.seen()) == sorted(set(codes.tolist()))


@SETTINGS
@given(trace=traces(), cut=st.floats(0, 1))
def test_state_taken_from_the_model_decides_on_as_the_model(trace, cut):
    """The model decides a prefix; its state, imported, carries the compiled replay on."""
    name, options, codes, times, costs = trace
    k = int(cut * len(codes))
    model = model_for(name, options)
    by_the_model(model, codes[:k], times[:k], costs[:k])
    replayer = replayer_for(name, options)
    for code, who in enumerate(IDENTITIES):
        replayer.set_state(code, copy.deepcopy(model.state.get(who.encode())))
    expected = by_the_model(model, codes[k:], times[k:], costs[k:])
    assert_same(expected, replayer.decide(codes[k:], times[k:], costs[k:]))
    for code, who in enumerate(IDENTITIES):
        assert replayer.state(code) == model.state.get(who.encode())


def frame(codes, times, costs) -> pd.DataFrame:
    return pd.DataFrame(
        {
            # Whole ms plus a fraction: the replay floors, as the limiters do.
            "time": (times + 0.25) / 1000,
            "identity": [IDENTITIES[c] for c in codes],
            "cost": costs.astype(np.int64),
            "replica": np.zeros(len(codes), dtype=np.int64),
        }
    )


@settings(max_examples=60, deadline=None)
@given(trace=traces(), keep=st.booleans())
def test_simulation_replay_compiled_equals_the_model_path(trace, keep):
    """`replay` with a model: the same table and the same `model.state` either way,
    starting from state an earlier replay kept."""
    name, options, codes, times, costs = trace
    k = len(codes) // 2
    earlier, later = frame(codes[:k], times[:k], costs[:k]), frame(codes[k:], times[k:], costs[k:])
    fast, slow = model_for(name, options), model_for(name, options)
    for model in (fast, slow):
        simulation.replay(earlier, model, keep_state=True, compiled=False)
    out_fast = simulation.replay(later, fast, keep_state=keep, compiled=True)
    out_slow = simulation.replay(later, slow, keep_state=keep, compiled=False)
    pd.testing.assert_frame_equal(out_fast, out_slow)
    assert fast.state == slow.state


def test_the_compiled_path_is_the_one_taken(monkeypatch):
    """So the comparisons above do compare two paths."""
    calls = []
    original = Replayer.decide

    def spy(self, *args):
        calls.append(len(args[0]))
        return original(self, *args)

    monkeypatch.setattr(Replayer, "decide", spy)
    trace = frame(np.array([0, 1, 0]), np.array([0, 5, 10]), np.array([1, 1, 1]))
    simulation.replay(trace, reference.SlidingWindowLimiter(1, 10))
    assert calls == [3]
    simulation.replay(trace, reference.SlidingWindowLimiter(1, 10), compiled=False)
    monkeypatch.setattr(simulation, "COMPILED", False)
    simulation.replay(trace, reference.FixedWindowLimiter(1, 10))
    assert calls == [3]


def test_what_the_compiled_path_cannot_do_exactly_goes_to_the_model(monkeypatch):
    """Times past 2**53 ms, a model with its own `run`, one identity spelt as str and
    as bytes: the model decides, as it always did."""
    calls = []
    monkeypatch.setattr(Replayer, "decide", lambda *a: calls.append(a) or None)
    far = frame(np.array([0, 0]), np.array([2**54, 2**54 + 512]), np.array([1, 1]))
    assert np.abs(seconds_to_ms(far["time"])).min() >= fastreplay.MAX_EXACT_MS
    decided = simulation.replay(far, reference.SlidingWindowLimiter(1, 1))
    assert decided["allowed"].tolist() == [True, False]

    class Lenient(reference.FixedWindowLimiter):
        def run(self, identity, times_ms, costs):
            n = len(times_ms)
            return [True] * n, [0] * n, [0] * n, [0] * n

    trace = frame(np.array([0, 0, 0]), np.array([0, 1, 2]), np.array([1, 1, 1]))
    assert simulation.replay(trace, Lenient(1, 1))["allowed"].all()
    mixed = trace.assign(identity=pd.Series(["a", b"a", "a"], dtype=object))
    both = simulation.replay(mixed, reference.SlidingWindowLimiter(1, 2))
    assert both["allowed"].sum() == 2  # one identity, one limit
    assert calls == []


@pytest.mark.parametrize("name", NAMES)
def test_identities_added_later_and_far_apart_codes(name):
    """Codes may grow between calls and need not be contiguous."""
    replayer = Replayer(name, 2, 1000)
    first = replayer.decide([5], [0], [1])
    later = replayer.decide([5, 70_000, 5], [1, 1, 2], [1, 1, 1])
    assert first[0].tolist() == [True]
    assert later[0].tolist() == [True, True, False]  # identity 5's third within a second
    assert len(replayer) == 70_001 and replayer.seen().tolist() == [5, 70_000]
    assert replayer.state(3) is None


def test_a_large_limit_log_stays_small():
    """10,000 identities with two requests each at limit 100,000: the pool holds a few
    pairs per identity, not the limit's worth."""
    identities, limit = 10_000, 100_000
    replayer = Replayer("log", limit, 60_000)
    codes = np.repeat(np.arange(identities), 2)
    times = np.tile([0, 7], identities) + codes  # two distinct ms per identity
    costs = np.tile([1, 500], identities)
    allowed, remaining, _ = replayer.decide(codes, times, costs)
    assert allowed.all() and remaining[1::2].tolist() == [limit - 501] * identities
    # A few hundred bytes per identity, against identities * limit * 8 = 8 GB.
    assert replayer.nbytes < 400 * identities
    assert replayer.state(17) == [17] + [24] * 500


def test_a_log_ring_grows_moves_and_wraps_in_the_pool():
    """One identity admitted at ten thousand distinct ms while many others hold small
    rings: its ring doubles and moves many times, and wraps as stamps leave."""
    replayer = Replayer("log", 3_000, 5_000)
    model = reference.SlidingWindowLimiter(limit=3_000, window_ms=5_000)
    rng = np.random.default_rng(3)
    codes = rng.choice(200, size=20_000, p=np.r_[0.5, np.full(199, 0.5 / 199)])
    times = np.sort(rng.integers(0, 20_000, size=20_000))
    costs = rng.integers(1, 3, size=20_000)
    allowed, remaining, retry = replayer.decide(codes, times, costs)
    for code in (0, 1, 150):
        rows = np.flatnonzero(codes == code)
        a, r, w, _ = model.run(str(code).encode(), times[rows].tolist(), costs[rows].tolist())
        assert allowed[rows].tolist() == a and remaining[rows].tolist() == r
        assert retry[rows].tolist() == w
        assert replayer.state(code) == model.state[str(code).encode()]
    assert not allowed.all()  # the busy identity did reach its limit


def test_the_pool_packs_rings_that_emptied_and_decisions_carry_on(monkeypatch):
    """300 identities fill rings of 256 pairs, then each trims to one pair; 40,000 new
    identities need more room than the pool has: it is packed (the emptied rings shrink),
    and every identity, old or new, goes on deciding as the model."""
    packed = []
    original = rings.compact
    monkeypatch.setattr(rings, "compact", lambda *a: packed.append(1) or original(*a))
    replayer = Replayer("log", 1_000, 1_000)
    model = reference.SlidingWindowLimiter(limit=1_000, window_ms=1_000)
    old, new = np.arange(300), np.arange(300, 40_300)
    phases = [
        (np.tile(old, 200), np.repeat(np.arange(200), 300)),  # 200 distinct ms each
        (old, np.full(300, 10_000)),  # the window has passed: each keeps one pair
        (np.tile(new, 3), np.repeat([20_000, 20_001, 20_002], len(new))),
        (np.tile(old, 2), np.repeat([20_003, 20_004], 300)),
    ]
    for codes, times in phases:
        costs = 1 + codes % 3
        decided = replayer.decide(codes, times, costs)
        expected = [np.zeros(len(codes), bool), np.zeros(len(codes), np.int64)]
        expected.append(np.zeros(len(codes), np.int64))
        for code in np.unique(codes):
            rows = np.flatnonzero(codes == code)
            a, r, w, _ = model.run(str(code).encode(), times[rows].tolist(), costs[rows].tolist())
            expected[0][rows], expected[1][rows], expected[2][rows] = a, r, w
        assert_same(expected, decided)
    assert packed  # the pool was packed, not only copied
    for code in (0, 299, 300, 40_299):
        assert replayer.state(code) == model.state[str(code).encode()]


@pytest.mark.parametrize(
    ("args", "options", "message"),
    [
        (([0], [0], [11]), {}, "costs must be between 1 and the limit"),
        (([0], [0], [0]), {}, "costs must be between 1"),
        (([-1], [0], [1]), {}, "codes must be >= 0"),
        (([0, 1], [0], [1]), {}, "one value per request"),
        (([0], [2**53], [1]), {}, "2\\*\\*53"),
        (([0], [0.5], [1]), {}, "times_ms must be integers"),
        (([[0]], [0], [1]), {}, "one-dimensional"),
        (([0], [0], [6]), {"algorithm": "gcra", "burst": 5}, "the limit and the burst"),
    ],
)
def test_bad_input_gets_a_clear_error(args, options, message):
    options = {"algorithm": "log", **options}
    replayer = Replayer(options.pop("algorithm"), 10, 1000, **options)
    with pytest.raises(ValueError, match=message):
        replayer.decide(*args)


def test_bad_options_get_the_models_errors():
    with pytest.raises(ValueError, match="limit must be >= 1"):
        Replayer("log", 0, 1000)
    with pytest.raises(ValueError, match="unknown algorithm"):
        Replayer("leaky", 10, 1000)
    with pytest.raises(ValueError, match="burst applies to gcra only, not 'fw'"):
        Replayer("fw", 10, 1000, burst=3)
    with pytest.raises(ValueError, match="2\\*\\*53"):
        Replayer("swc", 10**9, 366 * 24 * 3600 * 1000)
    assert Replayer("logc", 10, 1000).algorithm == "log"  # the compact log decides alike
    assert Replayer.for_model(reference.TokenBucketLimiter(1, 10, burst=4)).burst == 4


def test_codes_are_stable_across_chunks():
    codes = Codes()
    first = codes.encode(pd.Series(["b", "a", "b"]))
    second = codes.encode(np.array(["c", "a", "c"], dtype=object))
    third = codes.encode(iter(["a", "d"]))
    assert first.tolist() == [0, 1, 0] and second.tolist() == [2, 1, 2]
    assert third.tolist() == [1, 3] and third.dtype == np.int64
    assert len(codes) == 4 and [codes.identity(i) for i in range(4)] == ["b", "a", "c", "d"]
    assert codes.identities() == ["b", "a", "c", "d"]
    with pytest.raises(ValueError, match="missing"):
        codes.encode(["e", None])
