"""Seeded simulation of the replica's hand-over logic (`simulation.py`): thousands of scenarios,
each replayable from its seed, and proof that it catches hand-over bugs.

A failure prints its seeds; replay one (or several) with::

    .venv/bin/python tests/replication/simulation.py SEED [SEED ...]

``SIMULATION_SEEDS`` sets how many scenarios the main test plays (``make test``: 2,000).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

import simulation
from tickwheel.replication import dispatcher

SEEDS = int(os.environ.get("SIMULATION_SEEDS", "2000"))


def first_failing_seed(seeds: range) -> tuple[int, list[str]] | None:
    for seed in seeds:
        violations, _ = simulation.run(seed)
        if violations:
            return seed, violations
    return None


def test_every_seeded_scenario_loses_nothing_flags_every_repeat_and_is_never_early() -> None:
    failures = {}
    totals = {"scheduled": 0, "delivered": 0, "flagged": 0, "terms": 0, "restarts": 0}
    for seed in range(SEEDS):
        violations, summary = simulation.run(seed)
        if violations:
            failures[seed] = violations[:3]
        for key in totals:
            totals[key] += summary[key]
    assert failures == {}, f"failing seeds (replay with simulation.run(seed)): {failures}"
    # the scenarios did exercise what they claim to
    assert totals["terms"] > 1.3 * SEEDS, totals  # about a third of the runs change leader
    assert totals["restarts"] > SEEDS / 10, totals  # nodes come back from their files
    assert totals["delivered"] > totals["scheduled"] > 10 * SEEDS, totals


def test_a_scenario_replays_exactly_from_its_seed() -> None:
    def play(seed: int) -> tuple:
        with tempfile.TemporaryDirectory() as root:
            scenario = simulation.Run(seed, Path(root))
            try:
                return scenario.run(), scenario.deliveries, sorted(scenario.scheduled.items())
            finally:
                scenario.close()
    assert play(7) == play(7)
    assert play(7) != play(8)


def test_a_new_leader_that_flags_nothing_is_caught_by_a_replayable_seed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The injected bug: `Dispatcher.begin` forgets the hand-over horizon, so a new leader
    re-sends what its predecessor delivered without flagging it."""
    begin = dispatcher.Dispatcher.begin

    def forgetful_begin(self: dispatcher.Dispatcher, *args: object, **kwargs: object) -> None:
        begin(self, *args, **kwargs)
        self._horizon_ms = -1
    monkeypatch.setattr(dispatcher.Dispatcher, "begin", forgetful_begin)
    found = first_failing_seed(range(200))
    assert found is not None, "the injected bug went unnoticed in 200 seeds"
    seed, violations = found
    assert any("unflagged" in violation for violation in violations), violations
    assert simulation.run(seed)[0] == violations  # the seed replays the same failure


def test_a_leader_that_dispatches_past_its_lease_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The injected bug: the lease never runs out, so a leader cut off from its peers keeps
    dispatching while its successor does the same."""
    monkeypatch.setattr(simulation.SimRaft, "lease_until_s",
                        lambda self, lease_ms: float("inf") if self.believes_leader else 0.0)
    found = first_failing_seed(range(300))
    assert found is not None, "the injected bug went unnoticed in 300 seeds"
    assert any("unflagged" in violation for violation in found[1]), found
