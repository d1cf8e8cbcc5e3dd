"""Running a hypothesis state machine on one client: what the live-policy and the
peek-and-reset tests share."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings


def run_machine(machine: Any, client: Any, *, examples: int, steps: int) -> None:
    """Run `machine` (a `RuleBasedStateMachine` whose rules use `machine.client`) on
    `client` for `examples` runs of at most `steps` steps each."""
    machine.client = client
    case = machine.TestCase
    case.settings = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    case().runTest()
