"""The nemesis strikes a healthy cluster only (in process: a fake cluster whose nodes answer
`ClusterInfo` as a node installing a snapshot does)."""

from __future__ import annotations

import itertools
import json
import threading
from pathlib import Path
from typing import Any

from tickwheel.chaos.events import EventLog, FaultEvent
from tickwheel.chaos.nemesis import Nemesis, NemesisConfig
from tickwheel.v1 import tickwheel_pb2 as pb


class Node:
    def __init__(self, applied: list[int]) -> None:
        self.applied = applied
        """What ``info`` answers as ``last_applied``, one value per call (the last repeats)."""

    def info(self) -> pb.ClusterInfoResponse:
        applied = self.applied.pop(0) if len(self.applied) > 1 else self.applied[0]
        return pb.ClusterInfoResponse(commit_index=500, last_applied=applied)

    def alive(self) -> bool:
        return True


class Cluster:
    def __init__(self, *shards: list[Node]) -> None:
        self.shards = list(shards)
        self.nodes = [node for nodes in shards for node in nodes]

    def leader(self, timeout_s: float, shard: int = 0) -> Node:
        return self.shards[shard][0]

    def name(self, node: Node) -> str:
        return f"node{self.nodes.index(node)}"


def test_the_next_fault_waits_for_a_node_still_installing_its_snapshot(tmp_path: Path) -> None:
    # Before: a partition of the leader 10 s after a follower-wipe found the wiped node still
    # installing (12 s), and with it the only majority left: 4.6 s without a delivery.
    installing = Node([0, 0, 0, 120, 500])
    cluster: Any = Cluster([Node([500]), Node([500]), installing])
    nemesis = Nemesis(cluster, NemesisConfig(leader_timeout_s=5), 1,
                      EventLog(tmp_path / "faults.jsonl"), threading.Event())
    assert nemesis._leader(0) is cluster.nodes[0]
    assert installing.applied == [500]  # asked until it had applied what was committed


def test_with_shards_a_fault_hits_each_shard_in_turn_or_every_shard_at_once(
        tmp_path: Path) -> None:
    """Two shards: the faults alternate between them, and some hit both at the same time
    (each in a thread of its own); each is written down with its shard."""
    cluster: Any = Cluster([Node([500]) for _ in range(3)], [Node([500]) for _ in range(3)])
    faults: EventLog[FaultEvent] = EventLog(tmp_path / "faults.jsonl")
    nemesis = Nemesis(cluster, NemesisConfig(faults=("kill",)), 7, faults, threading.Event())
    calls: list[list[tuple[int, bool]]] = []
    meeting: list[threading.Barrier] = []

    def kill(shard: int) -> tuple[Node, str]:
        """Note the shard, and whether another shard's kill ran at the same time."""
        try:
            meeting[-1].wait()
        except threading.BrokenBarrierError:
            calls[-1].append((shard, False))
        else:
            calls[-1].append((shard, True))
        return cluster.leader(0, shard), "killed"
    nemesis._actions["kill"] = kill
    for _ in range(12):
        calls.append([])
        meeting.append(threading.Barrier(2, timeout=0.3))
        nemesis._inflict("kill")
    faults.close()
    at_once = [fault for fault in calls if len(fault) == 2]
    in_turn = [fault[0][0] for fault in calls if len(fault) == 1]
    assert at_once and len(at_once) + len(in_turn) == 12
    for fault in at_once:  # both shards, at the same time
        assert sorted(fault) == [(0, True), (1, True)]
    assert set(in_turn) == {0, 1} and all(a != b for a, b in itertools.pairwise(in_turn))
    written = [json.loads(line) for line in (tmp_path / "faults.jsonl").read_text().splitlines()]
    assert sorted(line["shard"] for line in written) == sorted(
        shard for fault in calls for shard, _ in fault)
