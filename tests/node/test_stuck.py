"""A node that cannot go on stops with a named exit code and says why, on real ``tickwheel
serve`` processes: a snapshot it cannot load, an entry it cannot apply, an applied index that
stands still (the watchdog)."""

from __future__ import annotations

import pickle
import re
import time
from pathlib import Path

import pytest

from tickwheel.common.exits import (
    EXIT_APPLY_FAILED,
    EXIT_NAMES,
    EXIT_SNAPSHOT_UNREADABLE,
    EXIT_STALLED,
)
from tickwheel.harness.local_cluster import LocalCluster, LocalNode, wait_for
from tickwheel.node.ops.watchdog import HOLD_COMMITS_FILE
from tickwheel.replication.raft import JOURNAL_FILE, SNAPSHOT_FILE, read_snapshot, write_snapshot
from tickwheel.replication.raft.journal import AtomicJournal
from tickwheel.v1 import tickwheel_pb2 as pb

pytestmark = pytest.mark.cluster

EXIT_WAIT_S = 60.0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def schedule(cluster: LocalCluster, count: int, prefix: str) -> None:
    due_ms = now_ms() + 3_600_000
    for start in range(0, count, 10):
        cluster.schedule([pb.Message(id=f"{prefix}-{i}", topic="orders", body=b"x",
                                     deliver_at_ms=due_ms) for i in range(start, start + 10)])


def exit_code(node: LocalNode) -> int:
    """The node's exit code once it stops by itself (fails if it is still up after
    `EXIT_WAIT_S`: the node stayed up applying nothing)."""
    return node.started.wait(EXIT_WAIT_S)


def logged(node: LocalNode, pattern: str) -> str:
    found = re.search(pattern, node.log_path.read_text())
    assert found, f"{pattern!r} is not in {node.log_path}"
    return found.group(0)


def test_a_snapshot_of_a_newer_release_stops_the_node_with_its_code(tmp_path: Path) -> None:
    """A manifest with a part this release does not know (a newer release's) failed in the
    manifest's constructor; pysyncobj logged 'failed to load full dump' and the node served
    on, applying nothing: its journal begins after the entries it never applied."""
    with LocalCluster(tmp_path, size=1, extra_args=("--snapshot-min-entries", "5")) as cluster:
        node = cluster.nodes[0]
        cluster.leader()
        schedule(cluster, 60, "newer")
        snapshot = node.data / "raft" / SNAPSHOT_FILE
        wait_for(snapshot.exists, 20, "a snapshot")
        cluster.stop(node)
        parts, raft_tail = read_snapshot(str(snapshot))
        write_snapshot(str(snapshot), (*parts, ("a part of a newer release",)), raft_tail,
                       fsync=False)
        cluster.start(node)
        assert EXIT_NAMES[exit_code(node)] == EXIT_NAMES[EXIT_SNAPSHOT_UNREADABLE]
        logged(node, r"event=node_refused reason=snapshot_unreadable path=\S+snapshot "
                     r"TypeError")
        logged(node, r"event=replica_fatal .* code=EXIT_SNAPSHOT_UNREADABLE")


def test_an_entry_this_release_cannot_apply_stops_the_node_with_its_code(
        tmp_path: Path) -> None:
    """A command of a kind this release does not know (written by a newer one) is in the
    journal past the snapshot: replaying it at start stops the node, naming the entry."""
    with LocalCluster(tmp_path, size=1) as cluster:
        node = cluster.nodes[0]
        cluster.leader()
        schedule(cluster, 10, "unknown")
        cluster.stop(node)
        journal = AtomicJournal(str(node.data / "raft" / JOURNAL_FILE))
        entries = [journal[i] for i in range(len(journal))]
        last = max(i for i, (command, _, _) in enumerate(entries) if b"unknown-9" in command)
        command, index, term = entries[last]
        call = pickle.loads(command[1:])  # pysyncobj's (method, args): args[0] is ours
        data = call[1][0]
        unknown = data[:1] + bytes([200]) + data[2:]  # the kind byte; its CRC covers the rest
        changed = command[:1] + pickle.dumps((call[0], (unknown, *call[1][1:]), *call[2:]),
                                             protocol=5)
        journal.deleteEntriesFrom(last)
        for entry in [(changed, index, term), *entries[last + 1:]]:
            journal.add(*entry)
        journal._destroy()
        cluster.start(node)
        assert EXIT_NAMES[exit_code(node)] == EXIT_NAMES[EXIT_APPLY_FAILED]
        logged(node, rf"event=apply_failed address=\S+ index={index} kind=200 .*ValueError")


def test_a_follower_whose_apply_stalls_stops_serving_then_exits(tmp_path: Path) -> None:
    """A follower whose applied index stands still while the commit index moves stayed up for
    good, NOT_SERVING with nobody told why (last_applied 1 of 16,754). Past two election
    timeouts it says why and health is NOT_SERVING; past six it exits with `EXIT_STALLED`.
    The stall is the test hook's (``DATA/hold-commits``: the follower takes the leader's
    entries and applies none); the leader and the other follower go on."""
    flags = ("--fault-injection", "--stall-health-elections", "2", "--stall-exit-elections",
             "6")
    with LocalCluster(tmp_path, extra_args=flags) as cluster:
        leader = cluster.leader()
        follower = next(node for node in cluster.nodes if node is not leader)
        schedule(cluster, 10, "before")
        wait_for(lambda: "event=health serving=True" in follower.log_path.read_text(), 20,
                 "the follower serving")
        (follower.data / HOLD_COMMITS_FILE).touch()
        sent = 0
        while follower.alive() and sent < 400:  # the commit index moves: ~25 s at most
            schedule(cluster, 10, f"during-{sent}")
            sent += 10
        assert EXIT_NAMES[exit_code(follower)] == EXIT_NAMES[EXIT_STALLED]
        logged(follower, r"event=apply_stalled last_applied=\d+ commit_index=\d+ stalled_ms=")
        logged(follower, r"event=health serving=False reason=apply_stalled last_applied=")
        logged(follower, r"event=replica_fatal .* code=EXIT_STALLED reason='apply_stalled")
        assert all(node.alive() for node in cluster.nodes if node is not follower)
