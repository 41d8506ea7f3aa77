"""The nemesis strikes a healthy cluster only (in process: a fake cluster whose nodes answer
`ClusterInfo` as a node installing a snapshot does)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tickwheel.chaos.events import EventLog
from tickwheel.chaos.nemesis import Nemesis, NemesisConfig
from tickwheel.v1 import tickwheel_pb2 as pb


class Node:
    def __init__(self, applied: list[int]) -> None:
        self.applied = applied
        """What ``info`` answers as ``last_applied``, one value per call (the last repeats)."""

    def info(self) -> pb.ClusterInfoResponse:
        applied = self.applied.pop(0) if len(self.applied) > 1 else self.applied[0]
        return pb.ClusterInfoResponse(commit_index=500, last_applied=applied)


class Cluster:
    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes

    def leader(self, timeout_s: float) -> Node:
        return self.nodes[0]

    def running(self) -> Iterator[Node]:
        return iter(self.nodes)


def test_the_next_fault_waits_for_a_node_still_installing_its_snapshot(tmp_path: Path) -> None:
    # Before: a partition of the leader 10 s after a follower-wipe found the wiped node still
    # installing (12 s), and with it the only majority left: 4.6 s without a delivery.
    installing = Node([0, 0, 0, 120, 500])
    cluster: Any = Cluster([Node([500]), Node([500]), installing])
    nemesis = Nemesis(cluster, NemesisConfig(leader_timeout_s=5), 1,
                      EventLog(tmp_path / "faults.jsonl"), threading.Event())
    assert nemesis._leader() is cluster.nodes[0]
    assert installing.applied == [500]  # asked until it had applied what was committed
