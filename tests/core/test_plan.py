"""ratelimit.plan: the round trips of a check and of a batch, driven without Redis.

The plans do no I/O, so these tests feed them replies by hand: what each round trip
sends, and what the plan makes of each reply, for the async and sync limiters alike.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.exceptions

from ratelimit import plan

NOSCRIPT = redis.exceptions.NoScriptError("NOSCRIPT No matching script.")
DROPPED = redis.exceptions.ConnectionError("Connection closed by server.")
NOPERM = redis.exceptions.NoPermissionError("NOPERM no permissions to run 'script|load'")
WAIT = ("WAIT", 1, 333)


class Script:
    """What a plan reads of a registered script."""

    def __init__(self, name: str) -> None:
        self.sha = f"sha-{name}"
        self.script = f"-- {name}"


class Scripted:
    """A `send(key, commands)` that answers each round trip from a list of outcomes and
    records what was sent."""

    def __init__(self, *outcomes: Any) -> None:
        self.outcomes = list(outcomes)
        self.sent: list[list[tuple[Any, ...]]] = []

    def __call__(self, key: Any, commands: list[tuple[Any, ...]]) -> Any:
        self.sent.append(commands)
        outcome = self.outcomes.pop(0)
        return outcome(commands) if callable(outcome) else outcome

    def names(self) -> list[list[str]]:
        return [[c[0] for c in commands] for commands in self.sent]


S = Script("log")


def test_a_check_is_one_evalsha():
    send = Scripted([7])
    assert plan.run(plan.check(S, ["k"], [1, 2], None, 0.0), send, "k") == (7, None)
    assert send.sent == [[("EVALSHA", "sha-log", 1, "k", 1, 2)]]


def test_noscript_loads_and_calls_again_in_one_round_trip_then_eval():
    send = Scripted([NOSCRIPT], ["sha-log", NOSCRIPT], [5])
    assert plan.run(plan.check(S, ["k"], [1], None, 0.0), send, "k") == (5, None)
    assert send.names() == [["EVALSHA"], ["SCRIPT", "EVALSHA"], ["EVAL"]]
    assert send.sent[1][0] == ("SCRIPT", "LOAD", "-- log")
    assert send.sent[2][0] == ("EVAL", "-- log", 1, "k", 1)


def test_a_refused_load_is_the_outcome_not_an_eval():
    """A user who may not load scripts learns so: the plan does not go round it."""
    send = Scripted([NOSCRIPT], [NOPERM, NOSCRIPT])
    reply, _ = plan.run(plan.check(S, ["k"], [1], None, 0.0), send, "k")
    assert reply is NOPERM and len(send.sent) == 2


def test_wait_closes_every_round_trip_and_its_count_comes_back():
    send = Scripted([NOSCRIPT, 0], ["sha-log", 3, 1])
    assert plan.run(plan.check(S, ["k"], [1], WAIT, 0.0), send, "k") == (3, 1)
    assert [c[-1] for c in send.sent] == [WAIT, WAIT]


def test_a_dropped_connection_is_retried_once_within_the_window():
    send = Scripted(DROPPED, [4])
    assert plan.run(plan.check(S, ["k"], [1], None, 60.0), send, "k") == (4, None)
    with pytest.raises(redis.exceptions.ConnectionError):
        plan.run(plan.check(S, ["k"], [1], None, 60.0), Scripted(DROPPED, DROPPED), "k")


def test_no_retry_outside_the_window():
    send = Scripted(DROPPED, [4])
    with pytest.raises(redis.exceptions.ConnectionError):
        plan.run(plan.check(S, ["k"], [1], None, -1.0), send, "k")
    assert len(send.sent) == 1


def test_other_errors_are_never_retried():
    send = Scripted(redis.exceptions.TimeoutError("slow"), [4])
    with pytest.raises(redis.exceptions.TimeoutError):
        plan.run(plan.check(S, ["k"], [1], None, 60.0), send, "k")


def test_the_async_driver_sends_the_same_round_trips():
    send = Scripted([NOSCRIPT], ["sha-log", 9])

    async def asend(key: Any, commands: Any) -> Any:
        await asyncio.sleep(0)
        return send(key, commands)

    result = asyncio.run(plan.arun(plan.check(S, ["k"], [1], None, 0.0), asend, "k"))
    assert result == (9, None) and send.names() == [["EVALSHA"], ["SCRIPT", "EVALSHA"]]


def calls(n: int, script: Script = S) -> list[plan.Call]:
    return [(script, [f"k{i}"], [i]) for i in range(n)]


def test_a_batch_resends_only_what_met_noscript():
    send = Scripted([1, NOSCRIPT, 3, NOSCRIPT], ["sha-log", 2, 4])
    out = plan.run(plan.batch(calls(4), None, 0.0), send, None)
    assert [reply for reply, _ in out] == [1, 2, 3, 4]
    assert send.sent[1] == [
        ("SCRIPT", "LOAD", "-- log"),
        ("EVALSHA", "sha-log", 1, "k1", 1),
        ("EVALSHA", "sha-log", 1, "k3", 3),
    ]


def test_a_batch_loads_each_script_once():
    other = Script("gcra")
    mixed = [*calls(2), *calls(2, other)]
    send = Scripted([NOSCRIPT] * 4, ["sha-log", "sha-gcra", 1, 2, 3, 4])
    out = plan.run(plan.batch(mixed, None, 0.0), send, None)
    assert [reply for reply, _ in out] == [1, 2, 3, 4]
    assert [c[:2] for c in send.sent[1][:2]] == [("SCRIPT", "LOAD")] * 2


def test_a_batch_with_wait_gives_each_call_its_round_trips_count():
    send = Scripted([1, NOSCRIPT, 2], ["sha-log", 5, 0])
    out = plan.run(plan.batch(calls(2), WAIT, 0.0), send, None)
    assert out == [(1, 2), (5, 0)]


def test_a_dropped_share_goes_again_once_in_order():
    """A cluster pipeline hands back a lost node's share in place: only that share
    goes again, once."""
    send = Scripted([1, DROPPED, DROPPED], [2, 3])
    out = plan.run(plan.batch(calls(3), None, -1.0), send, None)
    assert [reply for reply, _ in out] == [1, 2, 3]
    assert [c[3] for c in send.sent[1]] == ["k1", "k2"]
    again = Scripted([DROPPED], [DROPPED])
    (result,) = plan.run(plan.batch(calls(1), None, -1.0), again, None)
    assert result[0] is DROPPED and len(again.sent) == 2


def test_a_batch_leaves_out_callers_that_gave_up():
    gone = {1}
    send = Scripted([NOSCRIPT, NOSCRIPT, NOSCRIPT], ["sha-log", 10, 30])

    out = plan.run(plan.batch(calls(3), None, 0.0, lambda i: i not in gone), send, None)
    assert [c[3] for c in send.sent[0]] == ["k0", "k2"]
    assert out[1] is None and [out[0][0], out[2][0]] == [10, 30]


def test_resent_is_told_of_each_call_sent_again_after_a_drop_and_of_nothing_else():
    """What a limiter counts in `resends`: a check sent again after its connection
    dropped (its first attempt may have run: charged twice), never a NOSCRIPT reload
    (the script did not run) nor a round trip that went through."""
    told: list[list[int]] = []
    plan.run(plan.check(S, ["k"], [1], None, 60.0, told.append), Scripted(DROPPED, [4]), "k")
    assert told == [[0]]
    told.clear()
    send = Scripted([NOSCRIPT], ["sha-log", 5])
    plan.run(plan.check(S, ["k"], [1], None, 60.0, told.append), send, "k")
    assert told == []
    twice = Scripted(DROPPED, DROPPED)
    with pytest.raises(redis.exceptions.ConnectionError):  # once at most
        plan.run(plan.check(S, ["k"], [1], None, 60.0, told.append), twice, "k")
    assert told == [[0]]


def test_resent_is_told_which_calls_of_a_batch_went_again():
    told: list[list[int]] = []
    # A cluster pipeline's lost share: only its calls.
    send = Scripted([1, DROPPED, NOSCRIPT, DROPPED], [2, 4, NOSCRIPT], ["sha-log", 3])
    out = plan.run(plan.batch(calls(4), None, -1.0, resent=told.append), send, None)
    assert [reply for reply, _ in out] == [1, 2, 3, 4] and told == [[1, 3]]
    # A whole round trip dropped: every call in it, less the callers that gave up.
    told.clear()
    gone: set[int] = set()
    send = Scripted(lambda _: gone.add(1) or DROPPED, [10, 30])
    wanted = lambda i: i not in gone  # noqa: E731
    out = plan.run(plan.batch(calls(3), None, 60.0, wanted, told.append), send, None)
    assert told == [[0, 2]] and [c[3] for c in send.sent[1]] == ["k0", "k2"]


def test_a_reset_is_one_command_retried_once_after_a_drop():
    unlink = ("UNLINK", "k")
    send = Scripted([1])
    assert plan.run(plan.command(unlink, 60.0), send, "k") == 1
    assert send.sent == [[unlink]]
    send = Scripted(DROPPED, [0])  # UNLINK run twice deletes the same key: safe to resend
    assert plan.run(plan.command(unlink, 60.0), send, "k") == 0
    assert send.sent == [[unlink], [unlink]]
    with pytest.raises(redis.exceptions.ConnectionError):
        plan.run(plan.command(unlink, 60.0), Scripted(DROPPED, DROPPED), "k")
    send = Scripted(DROPPED, [1])
    with pytest.raises(redis.exceptions.ConnectionError):
        plan.run(plan.command(unlink, -1.0), send, "k")  # outside the window
    assert len(send.sent) == 1
    error = redis.exceptions.NoPermissionError("NOPERM unlink")
    assert plan.run(plan.command(unlink, 60.0), Scripted([error]), "k") is error
