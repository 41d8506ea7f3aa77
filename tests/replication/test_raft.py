"""The Raft port on pysyncobj: the seams it relies on in the pinned pysyncobj, and a real
node in-process (one member, real sockets) driven through the port alone."""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path
from types import SimpleNamespace

import pysyncobj.pickle
import pysyncobj.syncobj
import pytest
from pysyncobj.monotonic import monotonic as raft_clock_s

from tickwheel.replication.local_cluster import free_ports, wait_for
from tickwheel.replication.raft import (
    PICKLE_PROTOCOL,
    InsecureCluster,
    RaftConfig,
    RaftNode,
    RaftStatus,
    Role,
    read_snapshot,
    write_snapshot,
)
from tickwheel.replication.raft.prevote import PreVote


class _Marker:
    """Unpickling this would call ``os.system``: what an attacker's pickle does."""

    def __reduce__(self) -> tuple:
        return (os.system, ("touch /tmp/tickwheel-should-never-exist",))


def test_pysyncobj_still_keeps_what_the_lease_and_election_postponing_read() -> None:
    # RaftNode reads two private pysyncobj attributes; pinned 0.3.17 must still have them.
    source = Path(__import__("pysyncobj.syncobj").syncobj.__file__).read_text()
    assert "self.__lastResponseTime[node] = monotonicTime()" in source
    assert "self.__raftElectionDeadline = monotonicTime() + self.__generateRaftTimeout()" in (
        source)
    assert hasattr(PreVote, "postpone_election")


def test_what_pysyncobj_unpickles_is_plain_data_only() -> None:
    # pysyncobj applies commands and loads snapshot chunks through its pickle module's loads,
    # which would build any class (and fall back to an unrestricted loader on error).
    source = Path(pysyncobj.syncobj.__file__).read_text()
    assert "import pysyncobj.pickle as pickle" in source
    assert "command = pickle.loads(command[1:])" in source
    plain = (7, (b"command", "text", 1.5, None, True, {1, 2}), {"key": [1, 2]})
    assert pysyncobj.pickle.loads(pickle.dumps(plain, protocol=5)) == plain
    for protocol in (2, 5):
        with pytest.raises(pickle.UnpicklingError, match=r"posix\.system"):
            pysyncobj.pickle.loads(pickle.dumps(_Marker(), protocol=protocol))
    assert not Path("/tmp/tickwheel-should-never-exist").exists()


def test_pysyncobj_pickles_with_a_protocol_that_carries_bytes_as_bytes() -> None:
    # Protocol 2 (pysyncobj's own choice) has no bytes type: a command went through a latin-1
    # string on every pickling, ~1 us a message on the leader. Importing the node sets it.
    source = Path(pysyncobj.pickle.__file__).read_text()
    assert "return pickle.dumps(obj, __protocol)" in source  # the seam raft/node.py sets
    command = bytes(range(256))
    assert pysyncobj.pickle.dumps(command)[:2] == bytes([pickle.PROTO[0], PICKLE_PROTOCOL])
    assert pysyncobj.pickle.loads(pysyncobj.pickle.dumps(command)) == command


def test_the_lease_is_measured_on_the_clock_pysyncobj_stamps_answers_with() -> None:
    # pysyncobj stamps answers with CLOCK_MONOTONIC_RAW; time.monotonic() may be far from it
    # (248 ms on the benchmark VM an hour after boot), so mixing them shrank the lease to ~2 ms.
    node = RaftNode.__new__(RaftNode)
    node._peers = ("a", "b")
    node._core = SimpleNamespace(_isLeader=lambda: True, _SyncObj__lastResponseTime={
        "a": raft_clock_s() - 0.1, "b": raft_clock_s() - 5})
    remaining_s = node.lease_until_s(250) - time.monotonic()
    assert 0.1 < remaining_s <= 0.15



def _ticking(node: RaftNode, condition: object, what: str) -> object:
    def step() -> object:
        node.tick(0.01)
        return condition()
    return wait_for(step, 10, what, poll_s=0)


def test_a_node_alone_leads_commits_what_it_proposes_and_reports_it_through_the_port(
        tmp_path: Path) -> None:
    applied: list[bytes] = []
    address = f"127.0.0.1:{free_ports(1)[0]}"

    def serialize(path: str, raft_tail: tuple) -> None:
        write_snapshot(path, (len(applied),), raft_tail, fsync=False)

    def deserialize(path: str) -> tuple:
        return read_snapshot(path)[1]

    node = RaftNode(address, [], tmp_path, RaftConfig(),
                    lambda command: applied.append(command) or len(applied),
                    (serialize, deserialize))
    try:
        _ticking(node, node.is_leader, "a node alone to lead")
        results: list[tuple[object, bool]] = []
        node.propose(b"first", lambda result, committed: results.append((result, committed)))
        node.propose(b"second", lambda result, committed: results.append((result, committed)))
        _ticking(node, lambda: len(results) == 2, "both commands to be applied")
        assert results == [(1, True), (2, True)]
        assert applied == [b"first", b"second"]
        status = node.status()
        assert isinstance(status, RaftStatus)
        assert (status.role, status.leader, status.connected) == (Role.LEADER, address, ())
        assert status.term == node.term() >= 1
        assert status.last_applied >= 2 and status.commit_index >= status.last_applied
        assert node.leader() == address
        assert node.lease_until_s(250) == float("inf")  # nobody else to hear from
        node.compact()
        _ticking(node, (tmp_path / "snapshot").exists, "a snapshot")
        assert read_snapshot(str(tmp_path / "snapshot"))[0] == (2,)
    finally:
        node.close()


def test_a_node_with_peers_and_no_secret_does_not_start(tmp_path: Path) -> None:
    with pytest.raises(InsecureCluster):
        RaftNode("127.0.0.1:1", ["127.0.0.1:2"], tmp_path, RaftConfig(), bytes,
                 (lambda *_: None, lambda _: ()))
