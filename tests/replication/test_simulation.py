"""Seeded simulation of the replica's hand-over logic (`simulation.py`): thousands of scenarios,
each replayable from its seed, and proof that it catches hand-over bugs.

A failure prints its seeds; replay one (or several) with::

    .venv/bin/python tests/replication/simulation.py SEED [SEED ...]

``SIMULATION_SEEDS`` sets how many scenarios the main test plays (``make test``: 2,000).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import simulation
from tickwheel.replication import groups, handout

SEEDS = int(os.environ.get("SIMULATION_SEEDS", "2000"))


def first_failing_seed(seeds: range, showing: str = "") -> tuple[int, list[str]] | None:
    """The first seed with a violation (that mentions ``showing``), and its violations."""
    for seed in seeds:
        violations, _ = simulation.run(seed)
        if any(showing in violation for violation in violations):
            return seed, violations
    return None


PARTS = 3
"""The seeds are played in this many parts (seed k in part k mod PARTS): `make check` hands the
parts to its workers side by side; `make test` plays them one after the other in the
background (tests/conftest.py)."""


@pytest.mark.timeout(900)
@pytest.mark.parametrize("part", range(PARTS))
def test_every_seeded_scenario_loses_nothing_flags_exactly_and_is_never_early(
        in_background: Callable[..., Any], part: int) -> None:
    """A minute of CPU or more in all, and no clock but the simulated one: in the background,
    where it waits for the CPU while the nodes of other tests run (hence the longer
    timeout)."""
    failures = {}
    totals = {"scheduled": 0, "delivered": 0, "flagged": 0, "terms": 0, "restarts": 0,
              "cancelled": 0, "rescheduled": 0}
    seeds = range(part, SEEDS, PARTS)
    for seed in seeds:
        violations, summary = in_background(simulation.run, seed)
        if violations:
            failures[seed] = violations[:3]
        for key in totals:
            totals[key] += summary[key]
    assert failures == {}, f"failing seeds (replay with simulation.run(seed)): {failures}"
    # the scenarios did exercise what they claim to
    played = len(seeds)
    assert totals["terms"] > 1.3 * played, totals  # about a third of the runs change leader
    assert totals["restarts"] > played / 10, totals  # nodes come back from their files
    assert totals["delivered"] > totals["scheduled"] > 10 * played, totals
    # cancels and reschedules raced the due time and won often enough to prove something
    assert totals["cancelled"] > played / 4 and totals["rescheduled"] > played / 4, totals


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


def test_a_leader_that_flags_no_repeated_lease_is_caught_by_a_replayable_seed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The injected bug: a delivery on a second lease of a message (its stream closed, or a
    new leader released it) is not flagged."""
    granted = handout.Planner.granted

    def unflagged(self: handout.Planner, *args: object) -> list:
        return [d._replace(possible_duplicate=False) for d in granted(self, *args)]
    monkeypatch.setattr(handout.Planner, "granted", unflagged)
    found = first_failing_seed(range(200))
    assert found is not None, "the injected bug went unnoticed in 200 seeds"
    seed, violations = found
    assert any("unflagged" in violation for violation in violations), violations
    assert simulation.run(seed)[0] == violations  # the seed replays the same failure


def test_a_leader_that_flags_first_leases_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The injected bug: the first version's rule, every delivery flagged; a first delivery
    flagged without an earlier lease in the log is a false alarm the simulation refuses."""
    granted = handout.Planner.granted

    def flag_all(self: handout.Planner, *args: object) -> list:
        return [d._replace(possible_duplicate=True) for d in granted(self, *args)]
    monkeypatch.setattr(handout.Planner, "granted", flag_all)
    found = first_failing_seed(range(20))
    assert found is not None, "the injected bug went unnoticed in 20 seeds"
    assert any("flagged on its first delivery" in v for v in found[1]), found


def test_a_new_leader_that_keeps_its_predecessors_stream_leases_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The injected bug: the barrier leaves the old leader's stream leases in place, so what
    its consumers held unacknowledged waits for the visibility timeout (longer than any
    scenario): lost, as far as the run can tell."""
    monkeypatch.setattr(groups.Groups, "release_streams", lambda self: 0)
    found = first_failing_seed(range(300))
    assert found is not None, "the injected bug went unnoticed in 300 seeds"
    assert any("lost" in violation for violation in found[1]), found


@pytest.mark.parametrize(("bug", "symptom"), [
    ("cancel", "delivered though a cancel answered CANCELLED"),
    ("move", "delivered due at another time"),
])
def test_a_cancel_or_reschedule_that_ignores_the_handout_is_caught(
        monkeypatch: pytest.MonkeyPatch, bug: str, symptom: str) -> None:
    """The injected bugs: a cancel of a readied message that answers CANCELLED but leaves it in
    its group; groups that forget a lease was granted, so a reschedule moves a message a
    group has leased already (a move retires its original through the cancel's own path)."""
    if bug == "cancel":
        monkeypatch.setattr(groups.Groups, "cancel", lambda self, handle, topic: (
            True if self._holding(handle, topic) else None))
    else:
        monkeypatch.setattr(groups.Groups, "_handed_out", lambda self, handle, holding: False)
    # the groups' bug also lets a cancel answer CANCELLED for a leased message: look for the
    # first seed where the symptom of the bug under test shows
    found = first_failing_seed(range(300), showing=symptom)
    assert found is not None, f"the injected bug went unnoticed in 300 seeds ({symptom})"


@pytest.mark.parametrize("skew_ms", [5_000, -5_000])
def test_one_clock_5_s_off_changes_nothing_even_while_its_node_leads(skew_ms: int) -> None:
    """Node n0's clock 5 s ahead or behind, the others true: whichever leads hands messages
    out by the time a majority of clocks reached (`ClusterClock`), so nothing goes out early
    by the true time (the scenario's check, with no allowance: the majority is true), and
    n0 leading does not hold messages back by its error (a fault still makes some late)."""
    late_ms = []
    with tempfile.TemporaryDirectory() as root:
        for seed in range(40):
            scenario = simulation.Run(seed, Path(root) / str(seed), skews_ms=(skew_ms, 0, 0))
            try:
                assert scenario.majority_ahead_ms == 0
                assert scenario.run() == [], f"seed {seed}"
            finally:
                scenario.close()
            late_ms += [at_ms - due_ms for _, _, at_ms, due_ms, node in scenario.deliveries
                        if node == "n0"]
    assert len(late_ms) > 200  # n0 led in many scenarios
    assert sorted(late_ms)[len(late_ms) // 2] < 1_000
