"""The lab's own access logs: the example round-trips through the loader, bad lines and
all; the big synthetic log is what it says.

Expectations come from the generators (`example_requests`), from `ipaddress` and from
the bytes of the file, never from the loader's own output.
"""

from __future__ import annotations

import ipaddress
import re
from datetime import datetime

import numpy as np
import pandas as pd
import pytest

from ratelimit.lab import accesslog, samplelog
from ratelimit.lab.samplelog import (
    EXAMPLE_BAD_LINES,
    EXAMPLE_DURATION_S,
    EXAMPLE_START,
    example_cost,
    example_requests,
    write_example,
    write_large,
)


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    path = write_example(tmp_path_factory.mktemp("example") / "access.log")
    trace, problems = accesslog.read(path, identity="user", cost=example_cost)
    return path, trace, problems


def test_example_size_span_and_format(example):
    path, trace, _ = example
    lines = path.read_bytes().split(b"\n")
    assert 10_000 <= len(lines) <= 50_000
    assert accesslog.detect_format(path) == "clf"
    span = trace["time"].max() - trace["time"].min()
    assert 10 * 60 <= span <= 30 * 60
    assert trace["time"].min() >= EXAMPLE_START
    assert trace["time"].max() < EXAMPLE_START + EXAMPLE_DURATION_S


def test_example_round_trips_to_the_generated_requests(example):
    _, trace, problems = example
    expected = example_requests()
    pd.testing.assert_frame_equal(trace, expected[["time", "identity", "cost", "replica"]])
    assert problems.parsed == len(expected)
    assert (trace["cost"] > 1).any()  # the geofence client's look-ups priced by radius


def test_example_bad_lines_are_exactly_the_documented_ones(example):
    path, _, problems = example
    data = path.read_bytes()
    assert not data.endswith(b"\n")  # the last line is cut off
    last = data.count(b"\n") + 1
    expected = {**EXAMPLE_BAD_LINES, last: "truncated"}
    assert {line: why for line, why, _ in problems.examples} == expected
    counts: dict[str, int] = {}
    for why in expected.values():
        counts[why] = counts.get(why, 0) + 1
    assert problems.counts == counts
    assert problems.lines == last
    assert problems.parsed + problems.skipped == problems.lines
    assert problems.late == 0  # a little out of order, well within the horizon


def test_example_is_a_little_out_of_order_with_mixed_offsets(example):
    path, _, _ = example
    text = path.read_text()
    stamps = re.findall(r"\[(\d\d/\w{3}/\d{4}:\d\d:\d\d:\d\d) ([+-]\d{4})\]", text)
    assert {offset for _, offset in stamps} == {"+0100", "-0500"}
    requests = example_requests()
    # In file order (the order requests finished) the start times are not sorted.
    every = text.split("\n")
    lines = [ln for i, ln in enumerate(every[:-1], 1) if i not in EXAMPLE_BAD_LINES]
    assert len(lines) == len(requests)
    times = _utc(lines)
    assert times != sorted(times)
    assert sorted(times) == (requests["time"]).tolist()


def _utc(lines):
    out = []
    for line in lines:
        stamp = line.split("[", 1)[1].split("]", 1)[0]
        out.append(datetime.strptime(stamp, "%d/%b/%Y:%H:%M:%S %z").timestamp())
    return out


def test_example_addresses_ipv4_ipv6_and_one_client_per_64(example):
    path, _, _ = example
    requests = example_requests()
    versions = {ipaddress.ip_address(a).version for a in requests["address"]}
    assert versions == {4, 6}
    rotating = requests.loc[requests["client"] == "heavy-2", "address"].unique()
    assert len(rotating) > 1
    networks = {ipaddress.ip_network(f"{a}/64", strict=False) for a in rotating}
    assert len(networks) == 1
    by_address, _ = accesslog.read(path)  # the default identity: the client address
    expected = [
        str(ipaddress.ip_network(f"{a}/64", strict=False)) if ":" in a else a
        for a in requests["address"]
    ]
    assert by_address["identity"].tolist() == expected
    # One identity per client, as the API keys say.
    assert by_address["identity"].nunique() == requests["client"].nunique()


def test_example_rate_spread(example):
    _, trace, _ = example
    per_key = trace.groupby("identity").size().sort_values(ascending=False)
    assert len(per_key) >= 100
    minutes = EXAMPLE_DURATION_S / 60
    assert per_key.iloc[0] / minutes > 300  # a heavy hitter, far above 100 a minute
    assert (per_key / minutes < 10).sum() > len(per_key) / 2  # most keys are quiet


def test_example_is_deterministic_per_seed(tmp_path):
    a = write_example(tmp_path / "a.log").read_bytes()
    b = write_example(tmp_path / "b.log").read_bytes()
    c = write_example(tmp_path / "c.log", seed=8).read_bytes()
    assert a == b
    assert a != c
    trace, problems = accesslog.read(tmp_path / "c.log", identity="user", cost=example_cost)
    pd.testing.assert_frame_equal(
        trace, example_requests(8)[["time", "identity", "cost", "replica"]]
    )
    assert set(problems.counts) == {"malformed", "bad time", "truncated"}


def test_example_cost():
    assert example_cost({"path": "/v1/tiles/1/2/3.png"}) == 1
    assert example_cost({"path": "/v1/geofence/within?lat=1&radius_m=1000.0"}) == 4
    assert example_cost({"path": "/v1/geofence/within?radius_m=300"}) == 1


def test_write_large(tmp_path):
    path = write_large(tmp_path / "big.log", 12_345, identities=300, seed=3)
    data = path.read_bytes()
    assert data.count(b"\n") == 12_345 and data.endswith(b"\n")
    assert write_large(tmp_path / "again.log", 12_345, identities=300, seed=3).read_bytes() == data
    assert write_large(tmp_path / "other.log", 12_345, identities=300, seed=4).read_bytes() != data
    trace, problems = accesslog.read(path, identity="user")
    assert problems.skipped == 0 and len(trace) == 12_345
    assert trace["identity"].nunique() <= 300
    times = trace["time"].to_numpy()
    assert np.all(np.diff(times) >= 0)
    # File order is time order already: nothing was held back for long.
    hosts = [line.split(b" ", 1)[0].decode() for line in data.split(b"\n")[:-1]]
    assert {ipaddress.ip_address(h).version for h in hosts} == {4, 6}
    # An identity's addresses stay in one /64 (IPv6) or are one address (IPv4).
    users = [line.split(b" ", 3)[2].decode() for line in data.split(b"\n")[:-1]]
    per_user: dict[str, set[str]] = {}
    for user, host in zip(users, hosts, strict=True):
        per_user.setdefault(user, set()).add(
            str(ipaddress.ip_network(f"{host}/64", strict=False)) if ":" in host else host
        )
    assert all(len(nets) == 1 for nets in per_user.values())


def test_write_large_spans_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(samplelog, "_LARGE_BLOCK", 1_000)
    path = write_large(tmp_path / "big.log", 4_500, identities=50)
    trace, problems = accesslog.read(path)
    assert len(trace) == 4_500 and problems.skipped == 0
    assert np.all(np.diff(trace["time"].to_numpy()) >= 0)
    assert write_large(tmp_path / "empty.log", 0).read_bytes() == b""


def test_write_large_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="lines"):
        write_large(tmp_path / "x.log", -1)
    with pytest.raises(ValueError, match="identities"):
        write_large(tmp_path / "x.log", 10, identities=0)
    with pytest.raises(ValueError, match="rate"):
        write_large(tmp_path / "x.log", 10, rate=0)
