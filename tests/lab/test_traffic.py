"""The synthetic traffic generators: shape, reproducibility, rates, the boundary attack.

Statistical checks use fixed seeds, so they are deterministic; the tolerances are
+-5 standard deviations of the quantity measured, so a correct generator fails one
with probability below 1e-6 for any seed and a seed change does not need re-tuning.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ratelimit.lab import traffic
from ratelimit.lab.traffic import (
    boundary_attack,
    geofence_cost,
    geofence_mix,
    merge,
    on_off,
    poisson,
    replica_clocks,
    skewed_replicas,
    zipf_fleet,
)

STANDARD = ["time", "identity", "cost", "replica"]


def check_trace(frame: pd.DataFrame, extra: tuple[str, ...] = ()) -> None:
    """Columns in order with their dtypes, index 0..n-1, sorted times, valid values."""
    assert list(frame.columns) == [*STANDARD, *extra]
    assert frame["time"].dtype == np.float64
    assert frame["identity"].dtype == "str"
    assert frame["cost"].dtype == np.int64
    assert frame["replica"].dtype == np.int64
    assert frame.index.equals(pd.RangeIndex(len(frame)))
    assert frame["time"].is_monotonic_increasing
    assert (frame["time"] >= 0).all()
    assert (frame["cost"] >= 1).all()
    assert (frame["replica"] >= 0).all()
    assert frame["identity"].notna().all()


def within_sigmas(observed: float, expected: float, sigma: float, k: float = 5.0) -> bool:
    return abs(observed - expected) <= k * sigma


# Each random generator with small parameters, and the extra columns it adds.
SMALL = {
    "poisson": (lambda seed: poisson(50, 10, seed=seed, replicas=3), ()),
    "on_off": (lambda seed: on_off(80, 0.5, 1.0, 10, seed=seed), ()),
    "zipf_fleet": (lambda seed: zipf_fleet(20, 50, 10, seed=seed), ()),
    "geofence_mix": (lambda seed: geofence_mix(50, 10, seed=seed), ("radius_m",)),
    "skewed_replicas": (
        lambda seed: skewed_replicas(50, 10, drift_ppm=50, seed=seed),
        ("clock_offset",),
    ),
}


@pytest.mark.parametrize("name", SMALL)
def test_shape_and_reproducibility(name):
    make, extra = SMALL[name]
    first = make(7)
    check_trace(first, extra)
    assert len(first) > 100
    pd.testing.assert_frame_equal(first, make(7))
    assert not first.equals(make(8))


@pytest.mark.parametrize("name", SMALL)
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**63))
def test_any_seed_gives_a_valid_trace(name, seed):
    make, extra = SMALL[name]
    check_trace(make(seed), extra)


@settings(max_examples=40, deadline=None)
@given(
    rate=st.floats(0.01, 200),
    duration=st.floats(0.001, 20),
    replicas=st.integers(1, 5),
    seed=st.integers(0, 2**32),
)
def test_poisson_any_parameters(rate, duration, replicas, seed):
    frame = poisson(rate, duration, seed=seed, replicas=replicas)
    check_trace(frame)  # also when there is no request at all
    assert (frame["time"] < duration).all()
    assert (frame["replica"].to_numpy() == np.arange(len(frame)) % replicas).all()
    assert (frame["cost"] == 1).all()
    assert (frame["identity"] == "client").all()


# Poisson-based generators over 1,000 s at 100/s: the count is Poisson(1e5), sd 316.
LONG = {
    "poisson": lambda: poisson(100, 1000, seed=1),
    "zipf_fleet": lambda: zipf_fleet(1000, 100, 1000, seed=1),
    "geofence_mix": lambda: geofence_mix(100, 1000, seed=1),
    "skewed_replicas": lambda: skewed_replicas(100, 1000, replicas=4, seed=1),
}


@pytest.mark.parametrize("name", LONG)
def test_rate_over_a_long_trace(name):
    frame = LONG[name]()
    expected = 100 * 1000
    assert within_sigmas(len(frame), expected, math.sqrt(expected))
    assert frame["time"].iloc[-1] < 1000
    # Exponential gaps: P(gap > mean) = 1/e; the fraction is binomial over n gaps.
    gaps = np.diff(frame["time"].to_numpy())
    p = math.exp(-1)
    assert within_sigmas((gaps > 0.01).mean(), p, math.sqrt(p * (1 - p) / len(gaps)))
    # Steady: each half of the trace has about half the requests (binomial, p = 1/2).
    first_half = (frame["time"] < 500).sum()
    assert within_sigmas(first_half, len(frame) / 2, math.sqrt(len(frame) / 4))


def test_poisson_starts_near_zero():
    # The first arrival is exponential with mean 1/rate.
    assert poisson(100, 10, seed=3)["time"].iloc[0] < 0.1


def test_on_off_bursts_and_silences():
    rate_on, on, off = 100.0, 0.5, 1.5
    frame = on_off(rate_on, on, off, 2000.0, seed=2)
    check_trace(frame)
    phase = frame["time"].to_numpy() % (on + off)
    assert (phase < on + 1e-9).all()  # nothing during the off-phases
    # 1,000 on-phases of 0.5 s: Poisson(50,000) requests, sd 224.
    expected = rate_on * on * 1000
    assert within_sigmas(len(frame), expected, math.sqrt(expected))
    # Within a burst, the requests are spread evenly over the on-phase (p = 1/2).
    early = (phase < on / 2).sum()
    assert within_sigmas(early, len(frame) / 2, math.sqrt(len(frame) / 4))


def test_on_off_cuts_the_last_phase_at_duration():
    frame = on_off(1000, 1.0, 1.0, 2.5, seed=0)  # on [0, 1), off, on [2, 2.5)
    times = frame["time"]
    assert ((times < 1) | ((times >= 2) & (times < 2.5))).all()
    assert within_sigmas((times >= 2).sum(), 500, math.sqrt(500))


def test_on_off_without_silence_is_plain_poisson():
    frame = on_off(100, 1.0, 0.0, 100, seed=4)
    assert within_sigmas(len(frame), 10_000, 100)


# --- boundary attack ----------------------------------------------------------------


def test_boundary_attack_exactly_at_the_boundary():
    frame = boundary_attack(10, 1.0, boundary=1.0, spread=0.01)
    check_trace(frame)
    assert (frame["identity"] == "attacker").all()
    times = frame["time"].tolist()
    ms = [math.floor(t * 1000) for t in times]
    assert ms == list(range(990, 1010))  # one request per ms, 990 .. 1009
    before, after = times[:10], times[10:]
    assert all(0.99 <= t < 1.0 for t in before)
    assert after[0] == 1.0
    assert all(1.0 <= t < 1.01 for t in after)
    # A fixed window of 10 per 1,000 ms sees 10 in window 0 and 10 in window 1 ...
    assert [m // 1000 for m in ms] == [0] * 10 + [1] * 10
    # ... so it admits all 20, within 2 * spread: twice the limit in 20 ms.
    assert times[-1] - times[0] < 0.02


@pytest.mark.parametrize("start", [1_000_000.0, 1_700_000_000.0])
def test_boundary_attack_split_survives_a_replay_start(start):
    # A replay sets a virtual clock to start + time; with a whole-second start the
    # first half still floors into the window before the boundary, the second after.
    frame = boundary_attack(10, 1.0, cycles=2)
    ms = [math.floor((start + t) * 1000) - round(start * 1000) for t in frame["time"]]
    assert [m // 1000 for m in ms] == [0] * 10 + [1] * 10 + [2] * 10 + [3] * 10


def test_boundary_attack_ignores_the_seed():
    pd.testing.assert_frame_equal(boundary_attack(5, 1.0, seed=1), boundary_attack(5, 1.0))


def test_boundary_attack_cycles_use_fresh_windows():
    limit, window, cycles = 4, 2.0, 3
    frame = boundary_attack(limit, window, boundary=2.0, spread=0.1, cycles=cycles)
    check_trace(frame)
    assert len(frame) == 2 * limit * cycles
    ms = np.floor(frame["time"].to_numpy() * 1000).astype(np.int64)
    # Boundaries at 2, 6, 10 s: windows [0,2) [2,4) [4,6) [6,8) [8,10) [10,12) each get
    # exactly `limit`, so a fixed-window limiter admits every request.
    counts = pd.Series(ms // 2000).value_counts().sort_index()
    assert counts.to_dict() == {w: limit for w in range(6)}
    # Each cycle puts 2 * limit inside 2 * spread seconds.
    for k in range(cycles):
        burst = frame["time"].iloc[2 * limit * k : 2 * limit * (k + 1)]
        boundary = 2.0 + 2 * k * window
        assert (burst.iloc[:limit] < boundary).all()
        assert burst.iloc[limit] == boundary
        assert burst.iloc[-1] - burst.iloc[0] < 0.2


@settings(max_examples=60, deadline=None)
@given(
    limit=st.integers(1, 300),
    spread_ms=st.integers(1, 1000),
    window_s=st.integers(1, 60),
    boundary_s=st.integers(1, 100_000),
    cycles=st.integers(1, 3),
)
def test_boundary_attack_millisecond_floors(limit, spread_ms, window_s, boundary_s, cycles):
    spread = spread_ms / 1000
    window = float(window_s)
    assume(spread <= window)
    frame = boundary_attack(limit, window, boundary=float(boundary_s), spread=spread, cycles=cycles)
    check_trace(frame)
    times = frame["time"].to_numpy()
    ms = np.array([math.floor(t * 1000) for t in times])
    for k in range(cycles):
        boundary_ms = (boundary_s + 2 * k * window_s) * 1000
        block = slice(2 * limit * k, 2 * limit * (k + 1))
        before, after = ms[block][:limit], ms[block][limit:]
        assert (before >= boundary_ms - spread_ms).all() and (before < boundary_ms).all()
        assert (after >= boundary_ms).all() and (after < boundary_ms + spread_ms).all()
        # Evenly spaced: neighbours spread / limit apart (to a ns of rounding).
        steps = np.diff(times[block])
        assert np.allclose(steps, spread / limit, rtol=0, atol=2e-9 + 1e-15 * boundary_ms)


# --- Zipf fleet ---------------------------------------------------------------------


def test_zipf_fleet_popularity():
    clients, exponent = 1000, 1.1
    frame = zipf_fleet(clients, 200, 500, exponent=exponent, seed=5)
    check_trace(frame)
    n = len(frame)
    harmonic = sum(k**-exponent for k in range(1, clients + 1))
    counts = frame["identity"].value_counts()
    assert counts.index[0] == "client-00001"
    for k in (1, 2, 10):
        p = k**-exponent / harmonic
        share = counts.get(f"client-{k:05d}", 0) / n
        assert within_sigmas(share, p, math.sqrt(p * (1 - p) / n)), k
    assert set(counts.index) <= {f"client-{k:05d}" for k in range(1, clients + 1)}


def test_zipf_fleet_identities():
    assert set(zipf_fleet(1, 10, 10)["identity"]) == {"client-00001"}
    wide = zipf_fleet(123_456, 100, 10, exponent=0.0)
    assert wide["identity"].str.len().eq(len("client-000001")).all()
    uniform = zipf_fleet(4, 1000, 100, exponent=0.0, seed=1)
    share = (uniform["identity"] == "client-00004").mean()
    assert within_sigmas(share, 0.25, math.sqrt(0.25 * 0.75 / len(uniform)))


# --- geofence -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("radius_m", "cost"),
    [
        (0, 1),
        (1.5, 1),
        (250, 1),
        (500, 1),  # the whole free disc
        (500.01, 2),  # just above: a second unit
        (707, 2),  # (707 / 500)^2 = 1.9994
        (708, 3),  # 2.0050
        (1000, 4),  # twice the radius, four times the area
        (1250, 7),  # 6.25
        (1500, 9),
        (1501, 10),  # 9.012 -> 10, the cap
        (5000, 10),  # 100, capped
    ],
)
def test_geofence_cost_by_hand(radius_m, cost):
    assert geofence_cost(radius_m) == cost
    assert type(geofence_cost(radius_m)) is int


def test_geofence_cost_cap():
    assert geofence_cost(5000, max_cost=100) == 100
    assert geofence_cost(5000, max_cost=1) == 1
    assert geofence_cost(1000, max_cost=3) == 3


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"radius_m": -1}, "radius_m"),
        ({"radius_m": math.nan}, "radius_m"),
        ({"radius_m": math.inf}, "radius_m"),
        ({"radius_m": "500"}, "radius_m"),
        ({"radius_m": 100, "max_cost": 0}, "max_cost"),
        ({"radius_m": 100, "max_cost": 2.5}, "max_cost"),
    ],
)
def test_geofence_cost_rejects(kwargs, name):
    with pytest.raises(ValueError, match=name):
        geofence_cost(**kwargs)


def test_geofence_mix_radii_and_costs():
    frame = geofence_mix(100, 1000, seed=6)
    check_trace(frame, ("radius_m",))
    radius = frame["radius_m"].to_numpy()
    assert frame["radius_m"].dtype == np.float64
    assert (radius > 0).all() and (radius <= 5000).all()
    n = len(frame)
    # Log-normal, median 150 m, sigma 1: P(r <= 500) = Phi(ln(500 / 150)).
    p = 0.5 * (1 + math.erf(math.log(500 / 150) / math.sqrt(2)))
    assert 0.85 < p < 0.9  # "most under 500 m"
    assert within_sigmas((radius <= 500).mean(), p, math.sqrt(p * (1 - p) / n))
    assert within_sigmas(np.median(radius), 150, 5)  # sd of a median ~ 1.25*150/sqrt(n)
    assert (radius > 1500).any()  # some large look-ups
    expected = [geofence_cost(r) for r in radius[:3000]]
    assert frame["cost"].iloc[:3000].tolist() == expected
    assert frame["cost"].max() == 10


def test_geofence_mix_parameters():
    frame = geofence_mix(50, 20, seed=1, median_radius_m=800, max_radius_m=1000, max_cost=3)
    assert frame["radius_m"].max() == 1000  # the cut-off is reached and respected
    assert frame["cost"].max() == 3
    point = geofence_mix(50, 20, seed=1, median_radius_m=100, radius_sigma=0.0)
    assert np.allclose(point["radius_m"], 100) and (point["cost"] == 1).all()


# --- skewed replicas ----------------------------------------------------------------


def test_replica_clocks_documented_layout():
    clocks = replica_clocks(3, 0.05, 20.0)
    assert clocks["replica"].tolist() == [0, 1, 2]
    assert clocks["offset"].tolist() == [-0.05, 0.0, 0.05]  # replica 0 furthest behind
    assert clocks["drift_ppm"].tolist() == [-20.0, 0.0, 20.0]
    five = replica_clocks(5, 0.1)
    assert np.allclose(five["offset"], [-0.1, -0.05, 0.0, 0.05, 0.1], rtol=0, atol=1e-15)
    assert (five["drift_ppm"] == 0).all()
    one = replica_clocks(1, 0.5, 100.0)
    assert one["offset"].tolist() == [0.0] and one["drift_ppm"].tolist() == [0.0]


def test_skewed_replicas_offsets():
    frame = skewed_replicas(100, 10, replicas=3, max_offset=0.05, seed=1)
    check_trace(frame, ("clock_offset",))
    assert (frame["replica"].to_numpy() == np.arange(len(frame)) % 3).all()
    by_replica = frame.groupby("replica")["clock_offset"].unique()
    assert [list(v) for v in by_replica] == [[-0.05], [0.0], [0.05]]


def test_skewed_replicas_drift():
    frame = skewed_replicas(100, 100, replicas=2, max_offset=0.01, drift_ppm=500, seed=2)
    clocks = replica_clocks(2, 0.01, 500)
    offset = clocks["offset"].to_numpy()[frame["replica"]]
    drift = clocks["drift_ppm"].to_numpy()[frame["replica"]] * 1e-6
    expected = offset + drift * frame["time"].to_numpy()
    assert np.allclose(frame["clock_offset"], expected, rtol=0, atol=1e-15)
    # After 100 s at -500 ppm, replica 0 is 10 ms + 50 ms behind.
    late = frame[(frame["replica"] == 0) & (frame["time"] > 99)]
    assert np.allclose(late["clock_offset"], -0.06, atol=1e-3)
    local = frame["time"] + frame["clock_offset"]  # what the replay layer computes
    assert (local[frame["replica"] == 1] > frame["time"][frame["replica"] == 1]).all()


def test_skewed_replicas_single_replica_keeps_true_time():
    frame = skewed_replicas(10, 10, replicas=1, max_offset=1.0, drift_ppm=100)
    assert (frame["clock_offset"] == 0).all() and (frame["replica"] == 0).all()


# --- merge --------------------------------------------------------------------------


def test_merge_sorts_and_fills():
    plain = poisson(20, 10, identity="a", seed=1)
    geo = geofence_mix(20, 10, identity="b", seed=2)
    skew = skewed_replicas(20, 10, identity="c", seed=3)
    merged = merge(plain, geo, skew)
    check_trace(merged, ("radius_m", "clock_offset"))
    assert len(merged) == len(plain) + len(geo) + len(skew)
    by_identity = {name: group for name, group in merged.groupby("identity")}
    assert by_identity["a"]["radius_m"].isna().all()
    assert (by_identity["a"]["clock_offset"] == 0.0).all()
    assert (by_identity["b"]["clock_offset"] == 0.0).all()
    assert by_identity["c"]["radius_m"].isna().all()
    assert by_identity["b"]["radius_m"].tolist() == geo["radius_m"].tolist()
    assert by_identity["c"]["clock_offset"].tolist() == skew["clock_offset"].tolist()
    assert by_identity["b"]["cost"].tolist() == geo["cost"].tolist()


def test_merge_is_stable_for_ties():
    first = boundary_attack(3, 1.0, identity="first")
    second = boundary_attack(3, 1.0, identity="second")
    merged = merge(first, second)
    check_trace(merged)
    assert merged["identity"].tolist() == ["first", "second"] * 6
    assert merged["time"].tolist() == [t for t in first["time"] for _ in range(2)]


def test_merge_edge_cases():
    check_trace(merge())
    assert len(merge()) == 0
    single = poisson(10, 5, seed=1)
    pd.testing.assert_frame_equal(merge(single), single)
    custom = single.assign(note="x")
    merged = merge(custom, skewed_replicas(10, 5, seed=2))
    assert list(merged.columns) == [*STANDARD, "note", "clock_offset"]
    with pytest.raises(ValueError, match=r"frames\[1\]"):
        merge(single, "not a frame")
    with pytest.raises(ValueError, match=r"frames\[0\].*cost"):
        merge(single.drop(columns="cost"))


# --- bad parameters -----------------------------------------------------------------

BAD = [
    (poisson, (0, 10), {}, "rate"),
    (poisson, (-1, 10), {}, "rate"),
    (poisson, (math.nan, 10), {}, "rate"),
    (poisson, ("10", 10), {}, "rate"),
    (poisson, (True, 10), {}, "rate"),
    (poisson, (10, 0), {}, "duration"),
    (poisson, (10, math.inf), {}, "duration"),
    (poisson, (10, 10), {"replicas": 0}, "replicas"),
    (poisson, (10, 10), {"replicas": 1.5}, "replicas"),
    (poisson, (10, 10), {"seed": -1}, "seed"),
    (poisson, (10, 10), {"seed": 1.0}, "seed"),
    (poisson, (10, 10), {"identity": ""}, "identity"),
    (poisson, (10, 10), {"identity": 7}, "identity"),
    (poisson, (1e6, 1e6), {}, "rate"),  # 1e12 requests: refused, not attempted
    (on_off, (0, 1, 1, 10), {}, "rate_on"),
    (on_off, (10, 0, 1, 10), {}, "on"),
    (on_off, (10, 1, -1, 10), {}, "off"),
    (on_off, (10, 1, 1, 0), {}, "duration"),
    (on_off, (10, 1, 1, 10), {"seed": "x"}, "seed"),
    (boundary_attack, (0, 1.0), {}, "limit"),
    (boundary_attack, (2.5, 1.0), {}, "limit"),
    (boundary_attack, (10, 0), {}, "window"),
    (boundary_attack, (10, 1.0), {"spread": 0}, "spread"),
    (boundary_attack, (10, 1.0), {"spread": 2.0}, "spread"),
    (boundary_attack, (10, 1.0), {"boundary": 0.005}, "boundary"),
    (boundary_attack, (10, 1.0), {"boundary": -1.0}, "boundary"),
    (boundary_attack, (10, 1.0), {"cycles": 0}, "cycles"),
    (boundary_attack, (10, 1.0), {"seed": -3}, "seed"),
    (boundary_attack, (10, 1.0), {"identity": ""}, "identity"),
    (boundary_attack, (100, 1.0), {"spread": 1e-8}, "spread"),
    (boundary_attack, (10**8, 1.0), {"spread": 1.0}, "limit"),
    (boundary_attack, (10, 1.0), {"cycles": 10**8}, "cycles"),
    (boundary_attack, (10, 86400.0), {"cycles": 100}, "cycles"),
    (zipf_fleet, (0, 10, 10), {}, "clients"),
    (zipf_fleet, (10, 0, 10), {}, "total_rate"),
    (zipf_fleet, (10, 10, -5), {}, "duration"),
    (zipf_fleet, (10, 10, 10), {"exponent": -1}, "exponent"),
    (geofence_mix, (0, 10), {}, "rate"),
    (geofence_mix, (10, 0), {}, "duration"),
    (geofence_mix, (10, 10), {"median_radius_m": 0}, "median_radius_m"),
    (geofence_mix, (10, 10), {"radius_sigma": -1}, "radius_sigma"),
    (geofence_mix, (10, 10), {"max_radius_m": 0}, "max_radius_m"),
    (geofence_mix, (10, 10), {"max_cost": 0}, "max_cost"),
    (skewed_replicas, (0, 10), {}, "rate"),
    (skewed_replicas, (10, 10), {"replicas": 0}, "replicas"),
    (skewed_replicas, (10, 10), {"max_offset": -0.1}, "max_offset"),
    (skewed_replicas, (10, 10), {"drift_ppm": -1}, "drift_ppm"),
    (skewed_replicas, (10, 10), {"drift_ppm": 2e6}, "drift_ppm"),
]


@pytest.mark.parametrize(
    ("function", "args", "kwargs", "name"),
    BAD,
    ids=[f"{f.__name__}-{name}-{i}" for i, (f, _, _, name) in enumerate(BAD)],
)
def test_bad_parameters_name_the_parameter(function, args, kwargs, name):
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        function(*args, **kwargs)


def test_public_names():
    for name in traffic.__all__:
        assert hasattr(traffic, name)
