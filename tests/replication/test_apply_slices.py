"""A tick applies committed entries for a bounded time: pysyncobj applied every committed
entry in one tick, so a node with many to apply (a follower catching up, a leader whose
entries commit together after a pause) answered nothing and sent no heartbeat meanwhile."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

from tickwheel.harness.ports import free_ports
from tickwheel.replication.raft.config import RaftConfig
from tickwheel.replication.raft.node import APPLY_SLICE_S, RaftNode
from tickwheel.replication.raft.snapshot import read_snapshot, write_snapshot

APPLY_S = 0.002
"""What applying one command costs here."""
WAIT_S = 1.0
"""What each tick may wait for its poller: far above a slice (20 ms) even when a busy host
preempts the test for a while (a 0.5 s wait, judged at 0.25 s, failed on a loaded host)."""


def test_a_tick_applies_for_a_slice_and_the_next_tick_goes_on_at_once(tmp_path: Path) -> None:
    applied: list[bytes] = []

    def apply(command: bytes) -> int:
        ends = time.monotonic() + APPLY_S
        while time.monotonic() < ends:
            pass
        applied.append(command)
        return len(applied)

    node = RaftNode(f"127.0.0.1:{free_ports(1)[0]}", [], tmp_path, RaftConfig(), apply,
                    (lambda path, tail: write_snapshot(path, (), tail),
                     lambda path: read_snapshot(path)[1]))
    try:
        deadline = time.monotonic() + 10
        while not node.is_leader():
            assert time.monotonic() < deadline, "a node alone did not lead"
            node.tick(0.01)
        results: list[tuple[object, bool]] = []
        commands = [b"%d" % i for i in range(100)]
        for command in commands:  # all queued before a tick: they commit together
            node.propose(command, lambda result, done: results.append((result, done)))
        per_tick: list[int] = []
        waits: list[float] = []
        while len(applied) < len(commands):
            assert time.monotonic() < deadline + 10, "the commands were not applied"
            before, started = len(applied), time.monotonic()
            node.tick(WAIT_S)  # a tick that leaves entries to apply does not wait
            waits.append(time.monotonic() - started)
            per_tick.append(len(applied) - before)
    finally:
        node.close()
    assert applied == commands
    assert results == [(i + 1, True) for i in range(100)]
    most = int(APPLY_SLICE_S / APPLY_S) + 1
    assert max(per_tick) <= most, per_tick  # before: 100 in one tick, 200 ms
    assert sum(1 for count in per_tick if count) >= len(commands) // most
    sliced = [wait for wait, count, after in zip(waits, per_tick, itertools.accumulate(per_tick),
                                                 strict=True) if count and after < 100]
    assert sliced and max(sliced) < WAIT_S / 2, waits  # none that left entries waited
