"""The Raft port on pysyncobj: the seams it relies on in the pinned pysyncobj, and a real
node in-process (one member, real sockets) driven through the port alone."""

from __future__ import annotations

import os
import pickle
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pysyncobj.pickle
import pysyncobj.syncobj
import pytest
from pysyncobj.monotonic import monotonic as raft_clock_s

from tickwheel.harness.local_cluster import wait_for
from tickwheel.harness.ports import free_ports
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
from tickwheel.replication.raft.catch_up import CatchUp
from tickwheel.replication.raft.clocks import PeerClocks
from tickwheel.replication.raft.journal import AtomicJournal
from tickwheel.replication.raft.prevote import STALL_ROUND_DELAY_S, PreVote
from tickwheel.replication.raft.tenure import ECHO, SENT, TenureClock
from tickwheel.replication.raft.versions import MemberVersions


class _Marker:
    """Unpickling this would call ``os.system``: what an attacker's pickle does."""

    def __reduce__(self) -> tuple:
        return (os.system, ("touch /tmp/tickwheel-should-never-exist",))


def test_pysyncobj_still_has_what_the_tenure_and_election_postponing_read() -> None:
    # RaftNode reads two private pysyncobj attributes; pinned 0.3.17 must still have them.
    source = Path(__import__("pysyncobj.syncobj").syncobj.__file__).read_text()
    assert "'type': 'next_node_idx'," in source  # the answer the tenure reads its echo from
    assert "self.__raftElectionDeadline = monotonicTime() + self.__generateRaftTimeout()" in (
        source)
    assert hasattr(PreVote, "postpone_election")
    # a tick loads the snapshot, then checks the timer (`PreVote.after_stall`)
    assert source.index("self.__loadDumpFile(clearJournal=False)") < source.index(
        "if self.__raftElectionDeadline < monotonicTime() and self.__connectedToAnyone():")
    # the hand-over (raft/handover.py): TimeoutNow, and the flag PreVote lets stand at once
    assert "'type': 'timeout_now'," in source and "self.__transferInProgress = True" in source


def test_after_a_stall_a_follower_waits_a_timeout_and_a_node_starting_stands_at_once() -> None:
    """A snapshot install at start (every member, after a restart of all) stalled the Raft
    thread, and a whole election timeout more was waited before anyone stood."""

    class Core:  # what PreVote reads of pysyncobj's SyncObj for this
        raftCurrentTerm = 3
        _SyncObj__raftElectionDeadline = 0.0

        def _SyncObj__generateRaftTimeout(self) -> float:
            return 0.6

    core = Core()
    vote = PreVote(core, 2, 500)  # type: ignore[arg-type]
    vote.after_stall()
    soon = core._SyncObj__raftElectionDeadline - raft_clock_s()
    assert 0 < soon <= STALL_ROUND_DELAY_S  # past pysyncobj's own check, then a round
    assert not vote.on_message(object(), "append_entries", {"term": 3})  # a leader heard
    vote.after_stall()
    assert core._SyncObj__raftElectionDeadline - raft_clock_s() > 0.5


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


def test_tenure_counts_from_what_a_majority_answered_and_only_this_leadership() -> None:
    now = [100.0]
    leader, follower = TenureClock(lambda: now[0]), TenureClock(lambda: now[0])
    # what the follower answers carries the send time of what it is answering
    heartbeat = {"type": "append_entries", "term": 3}
    leader.outgoing("f", heartbeat)
    now[0] = 101.0
    follower.incoming("l", heartbeat)
    answer = {"type": "next_node_idx", "next_node_idx": 7}
    follower.outgoing("l", answer)
    assert SENT not in heartbeat and answer[ECHO] == 100.0
    now[0] = 102.0
    leader.incoming("f", answer)
    assert ECHO not in answer  # pysyncobj never sees the stamps
    assert leader.until_s(1, 250, since_s=99.0) == 100.25  # from the send, not the read
    assert leader.until_s(1, 250, since_s=100.5) == 0.0  # an answer from before it led
    assert leader.until_s(2, 250, since_s=99.0) == 0.0  # 5 nodes: two peers must answer
    assert leader.until_s(0, 250, since_s=99.0) == float("inf")  # alone
    # an older answer read later does not move the tenure back; a forged stamp counts as none
    leader.incoming("f", {"type": "next_node_idx", ECHO: 50.0})
    leader.incoming("g", {"type": "next_node_idx", ECHO: "tomorrow"})
    assert leader.until_s(1, 250, since_s=0.0) == 100.25
    assert leader.until_s(2, 250, since_s=0.0) == 0.0


def _ticking(node: RaftNode, condition: object, what: str) -> object:
    def step() -> object:
        node.tick(0.01)
        return condition()
    return wait_for(step, 10, what, poll_s=0)


def test_a_node_alone_leads_commits_what_it_proposes_and_reports_it_through_the_port(
        tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_ports(1)[0]}"
    node, applied = _counting_node(tmp_path, RaftConfig(), address)
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
        assert node.tenure_until_s(250) == float("inf")  # nobody else to hear from
        node.compact()
        _ticking(node, (tmp_path / "snapshot").exists, "a snapshot")
        assert read_snapshot(str(tmp_path / "snapshot"))[0] == (2,)
    finally:
        node.close()


def test_a_leader_sends_what_one_step_proposed_in_one_append_entries_per_follower(
        tmp_path: Path) -> None:
    # Unbatched, pysyncobj sent a round of AppendEntries for every proposal, and another after
    # every tick that applied: each a turn of every follower. `RaftNode` sends once a tick.
    source = Path(pysyncobj.syncobj.__file__).read_text()
    on_tick = source[source.index("def _onTick("):source.index("def __applyLogEntries(")]
    assert (on_tick.index("self._checkCommandsToApply()") < on_tick.index("callback()")
            < on_tick.index("self._poller.poll(timeToWait)"))  # taken into the log, sent, then poll
    addresses = [f"127.0.0.1:{port}" for port in free_ports(2)]
    config = RaftConfig(secrets=(b"a secret of the two of them",))
    applied: dict[str, list[bytes]] = {address: [] for address in addresses}
    nodes = [RaftNode(address, [other for other in addresses if other != address],
                      tmp_path / address.replace(":", "_"), config,
                      lambda command, seen=applied[address]: seen.append(command) or len(seen),
                      (lambda *_: None, lambda _: ()))
             for address in addresses]
    try:
        def tick_both() -> None:
            for node in nodes:
                node.tick(0.005)
        wait_for(lambda: tick_both() or any(node.is_leader() for node in nodes), 10,
                 "a leader", poll_s=0)
        leader, follower = sorted(nodes, key=lambda node: not node.is_leader())
        followed = applied[follower._core.selfNode.address]
        leader.propose(b"first", lambda *_: None)
        wait_for(lambda: tick_both() or followed, 10, "a first command on the follower",
                 poll_s=0)
        received: list[dict] = []
        core = follower._core
        handler = core._SyncObj__onMessageReceived
        core._SyncObj__onMessageReceived = lambda peer, message: (
            received.append(dict(message)), handler(peer, message))
        results: list[object] = []
        for number in range(5):
            leader.propose(b"command %d" % number, lambda result, _: results.append(result))
        commands = [b"command %d" % number for number in range(5)]
        wait_for(lambda: tick_both() or followed[-5:] == commands, 10,
                 "the follower to apply the five", poll_s=0)
        carrying = [m for m in received if m.get("type") == "append_entries" and m.get("entries")]
        assert len(carrying) == 1 and len(carrying[0]["entries"]) == 5
        assert len(results) == 5
    finally:
        for node in nodes:
            node.close()


def test_wakes_before_a_tick_returns_write_the_pipe_once(tmp_path: Path) -> None:
    node, _ = _counting_node(tmp_path, RaftConfig())
    try:
        _ticking(node, node.is_leader, "a node alone to lead")
        writes: list[None] = []
        notify = node._notifier.notify
        node._notifier.notify = lambda: (writes.append(None), notify())[-1]
        for _ in range(3):
            node.wake()
        assert len(writes) == 1
        started = time.monotonic()
        node.tick(5.0)
        assert time.monotonic() - started < 2.5  # the one byte ended the wait
        node.wake()
        assert len(writes) == 2  # after the tick returned, a wake writes again
    finally:
        node.close()


def test_a_node_with_peers_and_no_secret_does_not_start(tmp_path: Path) -> None:
    with pytest.raises(InsecureCluster):
        RaftNode("127.0.0.1:1", ["127.0.0.1:2"], tmp_path, RaftConfig(), bytes,
                 (lambda *_: None, lambda _: ()))


def test_a_paused_leader_that_reads_answers_sent_during_its_pause_holds_no_tenure(
        tmp_path: Path) -> None:
    # The CI failure of stop 23: pysyncobj stamped answers when it read them, so a leader
    # resumed after a pause read its followers' old answers and thought its tenure fresh.
    addresses = [f"127.0.0.1:{port}" for port in free_ports(2)]
    config = RaftConfig(secrets=(os.urandom(32),))
    nodes = [RaftNode(address, [other for other in addresses if other != address],
                      tmp_path / str(index), config, lambda command: None,
                      (lambda path, tail: write_snapshot(path, (), tail, fsync=False),
                       lambda path: read_snapshot(path)[1]))
             for index, address in enumerate(addresses)]
    try:
        def both_lead_or_follow() -> bool:
            for node in nodes:
                node.tick(0.005)
            return any(node.tenure_until_s(config.tenure_ms) > time.monotonic()
                       for node in nodes)
        wait_for(both_lead_or_follow, 10, "a leader with tenure", poll_s=0)
        leader = next(node for node in nodes if node.is_leader())
        follower = next(node for node in nodes if node is not leader)
        leader.propose(b"x", lambda result, committed: None)
        leader.tick(0)  # sends the entry: the last thing it does before its pause
        paused_s = time.monotonic()
        # the follower answers while the leader is paused; the answer waits in its socket
        while time.monotonic() < paused_s + config.tenure_ms / 1000 + 0.05:
            follower.tick(0.005)
        leader.tick(0)  # resumed: reads the answer sent during the pause
        assert leader.is_leader()
        assert leader.tenure_until_s(config.tenure_ms) <= paused_s + config.tenure_ms / 1000
        # and a leader that hears fresh answers has its tenure back
        wait_for(both_lead_or_follow, 5, "the tenure back", poll_s=0)
    finally:
        for node in nodes:
            node.close()


def test_a_snapshot_chunk_does_not_commit_the_followers_own_log() -> None:
    # pysyncobj commits "min(leader's commit, my last index)" on every AppendEntries, also on
    # the chunks of a snapshot, which carry no log position: a deposed leader catching up by
    # snapshot applied its own uncommitted entries (make chaos, stop 24: its wheel diverged).
    source = Path(pysyncobj.syncobj.__file__).read_text()
    assert ("self.__raftCommitIndex = min(leaderCommitIndex, self.__getCurrentLogIndex())"
            in source)
    assert "'serialized': transmissionData," in source  # and a chunk has no prevLogIdx
    seen: list[dict] = []
    node = RaftNode.__new__(RaftNode)
    node._tenure = TenureClock()
    node._clocks = PeerClocks(lambda: 0)
    node._versions = MemberVersions()
    node._pre_vote = SimpleNamespace(on_message=lambda *args: False)
    node._hold_file = None
    node._catch_up = CatchUp(None, lambda: None)
    node._core = SimpleNamespace(_SyncObj__raftCommitIndex=10, _SyncObj__leaderCommitIndex=0,
                                 _SyncObj__onMessageReceived=lambda _, m: seen.append(dict(m)),
                                 _SyncObj__serializer=SimpleNamespace(refused=False))
    node._on_message("leader", {"type": "append_entries", "term": 5, "commit_index": 50,
                                "serialized": b"chunk"})
    assert seen[-1]["commit_index"] == 10  # what pysyncobj saw: no further than it was
    assert node._core._SyncObj__leaderCommitIndex == 50  # what status reports: the leader's
    node._on_message("leader", {"type": "append_entries", "term": 5, "commit_index": 50,
                                "prevLogIdx": 12, "prevLogTerm": 5, "entries": []})
    assert seen[-1]["commit_index"] == 50  # a positioned AppendEntries is pysyncobj's to judge


def test_a_node_killed_between_its_snapshot_and_the_journal_cut_keeps_what_it_acknowledged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pysyncobj renames its snapshot into place and cuts the journal to it at its next tick.
    A node killed in between (its folder copied at that moment: what a SIGKILL leaves) came
    back with a journal of the snapshot's two entries only: every command after the snapshot,
    acknowledged, was gone from it, and from the cluster if such a node won an election."""
    live, killed = tmp_path / "live", tmp_path / "killed"
    acknowledged: list[bytes] = []
    at_kill: list[bytes] = []
    cut = AtomicJournal.deleteEntriesTo

    def kill_before_the_cut(journal: AtomicJournal, entry_to: int) -> None:
        if not killed.exists():
            shutil.copytree(live, killed)
            at_kill.extend(acknowledged)
        cut(journal, entry_to)

    monkeypatch.setattr(AtomicJournal, "deleteEntriesTo", kill_before_the_cut)
    node, applied = _counting_node(live, DURABLE)
    try:
        _ticking(node, node.is_leader, "a node alone to lead")
        for i in range(500):
            command = b"m%d" % i
            node.propose(command, lambda _, ok, command=command: ok and acknowledged.append(
                command))
            node.tick(0.0)
            if killed.exists():
                break
    finally:
        node.close()
    monkeypatch.undo()
    (in_snapshot,), _ = read_snapshot(str(killed / "snapshot"))
    assert len(at_kill) > in_snapshot  # acknowledged after the snapshot: the entries at stake
    node, applied = _counting_node(killed, DURABLE)
    try:
        _ticking(node, lambda: in_snapshot + len(applied) >= len(at_kill),
                 f"the {len(at_kill) - in_snapshot} commands acknowledged after the snapshot "
                 "to be applied again")
        assert applied[:len(at_kill) - in_snapshot] == at_kill[in_snapshot:]
    finally:
        node.close()


def test_late_acknowledgements_send_a_follower_neither_its_entries_nor_a_snapshot_again(
        tmp_path: Path) -> None:
    """A leader sends without waiting for answers, and answers arrive late. pysyncobj set a
    follower's next index to each acknowledgement's own position, back below what it had sent
    since; below the log's start, it sent its snapshot again for every late answer (the chaos
    runner: a wiped follower installed one snapshot 44 times in 15 s, each older than what it
    had applied). Here one follower's acknowledgements reach the leader only after the leader
    has taken a snapshot past all of them."""
    addresses = [f"127.0.0.1:{port}" for port in free_ports(3)]
    config = RaftConfig(secrets=(b"a secret of the three of them",))
    applied: dict[str, list[bytes]] = {address: [] for address in addresses}

    def serialize(path: str, raft_tail: tuple) -> None:
        write_snapshot(path, (0,), raft_tail, fsync=False)

    nodes = [RaftNode(address, [other for other in addresses if other != address],
                      tmp_path / address.replace(":", "_"), config,
                      lambda command, seen=applied[address]: seen.append(command) or len(seen),
                      (serialize, lambda path: read_snapshot(path)[1]))
             for address in addresses]

    def tick_all() -> None:
        for node in nodes:
            node.tick(0.002)

    try:
        wait_for(lambda: tick_all() or any(node.is_leader() for node in nodes), 10,
                 "a leader", poll_s=0)
        leader, late, _ = sorted(nodes, key=lambda node: not node.is_leader())  # and a prompt one
        late_address = late._core.selfNode.address
        received: list[dict] = []
        handler = late._core._SyncObj__onMessageReceived
        late._core._SyncObj__onMessageReceived = lambda peer, message: (
            received.append(message), handler(peer, message))
        held: list[tuple[object, dict]] = []
        holding = True

        def on_message(peer: object, message: dict) -> None:
            if (holding and getattr(peer, "address", None) == late_address
                    and message.get("type") == "next_node_idx" and message.get("success")):
                held.append((peer, message))
            else:
                leader._on_message(peer, message)

        leader._core._SyncObj__transport.setOnMessageReceivedCallback(on_message)
        for number in range(30):
            leader.propose(b"command %d" % number, lambda *_: None)
            tick_all()
        wait_for(lambda: tick_all() or len(applied[late_address]) >= 30, 10,
                 "the late follower to apply the thirty", poll_s=0)
        leader.compact()
        log = leader._core._SyncObj__raftLog
        wait_for(lambda: tick_all() or log[0][1] > 30, 10, "the leader's snapshot", poll_s=0)
        assert held and min(message["next_node_idx"] for _, message in held) <= log[0][1]
        holding = False
        received.clear()
        for number, (peer, message) in enumerate(held):  # at last, in order, under load
            leader._on_message(peer, message)
            leader.propose(b"late %d" % number, lambda *_: None)
            tick_all()
        leader.propose(b"after", lambda *_: None)
        wait_for(lambda: tick_all() or applied[late_address][-1:] == [b"after"], 10,
                 "the late follower to apply the next command", poll_s=0)
        assert not [m for m in received if "serialized" in m]  # no snapshot sent again
        again = [entry for m in received for entry in m.get("entries", ())
                 if entry[1] <= log[0][1]]
        assert not again  # nor entries it had acknowledged
    finally:
        for node in nodes:
            node.close()


def test_a_leader_hands_over_to_the_preferred_member_once_it_is_back_and_caught_up(
        tmp_path: Path) -> None:
    """Two members elect one of them; the preferred third starts late, catches up, and its
    leader hands over: proposals made all along are each answered once, in the log in order
    or failed as on any change of leader. PreVote would refuse the preferred member's round
    (its peers hear from a leader), so it stands at once when its leader tells it to."""
    addresses = [f"127.0.0.1:{port}" for port in free_ports(3)]
    preferred = addresses[2]
    config = RaftConfig(secrets=(b"a secret of the three of them",), preferred_leader=preferred,
                        handover_after_ms=200)
    applied: dict[str, list[bytes]] = {address: [] for address in addresses}

    def start(address: str) -> RaftNode:
        return RaftNode(address, [other for other in addresses if other != address],
                        tmp_path / address.replace(":", "_"), config,
                        lambda command, seen=applied[address]: seen.append(command) or len(seen),
                        (lambda *_: None, lambda _: ()))

    nodes = [start(address) for address in addresses[:2]]
    answers: dict[bytes, list[bool]] = {}

    def tick_all() -> None:
        for node in nodes:
            node.tick(0.002)
        leading = [node for node in nodes if node.is_leader()]
        if leading:  # a proposal a turn, on whoever leads
            command = b"c%d" % len(answers)
            answers[command] = []
            leading[0].propose(command, lambda _, ok, seen=answers[command]: seen.append(ok))

    try:
        first = wait_for(lambda: tick_all() or [n for n in nodes if n.is_leader()], 10,
                         "one of the first two to lead", poll_s=0)[0]
        term = first.term()
        nodes.append(start(preferred))
        wait_for(lambda: tick_all() or nodes[2].is_leader(), 15,
                 "the preferred member to lead", poll_s=0)
        assert nodes[2].term() == term + 1  # one election: the hand-over's
        assert not first.is_leader()
        stop = len(answers)
        wait_for(lambda: tick_all() or all(answers[c] for c in list(answers)[:stop]), 10,
                 "every proposal made until then to be answered", poll_s=0)
        assert all(len(seen) == 1 for seen in list(answers.values())[:stop])
        committed = [c for c in list(answers)[:stop] if answers[c] == [True]]
        assert len(committed) > stop / 2
        wait_for(lambda: tick_all() or set(committed) <= set(applied[preferred]), 10,
                 "the preferred member to apply what was committed", poll_s=0)
        order = [c for c in applied[preferred] if c in set(committed)]
        assert order == committed  # in the order proposed, each once
    finally:
        for node in nodes:
            node.close()


DURABLE = RaftConfig(fsync=True, snapshot_min_entries=20)
"""``--fsync`` and a snapshot every 20 entries."""


def _counting_node(raft_dir: Path, config: RaftConfig, address: str | None = None
                   ) -> tuple[RaftNode, list[bytes]]:
    """A node alone (at ``address``, else on a free port), whose snapshot holds the number of
    commands it applied (synced with ``config.fsync``); and the commands it applies."""
    applied: list[bytes] = []

    def serialize(path: str, raft_tail: tuple) -> None:
        write_snapshot(path, (len(applied),), raft_tail, fsync=config.fsync)

    def deserialize(path: str) -> tuple:
        return read_snapshot(path)[1]

    node = RaftNode(address or f"127.0.0.1:{free_ports(1)[0]}", [], raft_dir, config,
                    lambda command: applied.append(command) or len(applied),
                    (serialize, deserialize))
    return node, applied
