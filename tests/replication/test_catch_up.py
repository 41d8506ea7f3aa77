"""What a follower whose snapshot's files are being fetched lets pysyncobj see and answers
(`tickwheel.replication.raft.catch_up`), on a stand-in core; real nodes: test_install.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tickwheel.replication.raft.catch_up import CatchUp
from tickwheel.replication.raft.prevote import PRE_VOTE


class Fetch:
    def __init__(self) -> None:
        self.asked: list[str] = []
        self.over = False

    def prefetch(self, path: str, done: object) -> None:
        self.asked.append(path)

    def prefetched(self) -> bool:
        return self.over


def core(sent: list[tuple[object, dict[str, Any]]], calls: list[str]) -> SimpleNamespace:
    """The parts of pysyncobj's ``SyncObj`` a `CatchUp` reads and calls."""
    def send(node: object, success: bool = False, reset: bool = False) -> None:
        sent.append((node, {"success": success, "reset": reset}))
    return SimpleNamespace(
        _SyncObj__raftLeader="leader", _SyncObj__raftElectionDeadline=0.0,
        _SyncObj__generateRaftTimeout=lambda: 0.5, _SyncObj__sendNextNodeIdx=send,
        _SyncObj__getCurrentLogIndex=lambda: 40,
        _SyncObj__serializer=SimpleNamespace(put_in_place=lambda p: calls.append(f"put {p}")),
        _SyncObj__loadDumpFile=lambda clearJournal: calls.append(f"load {clearJournal}"))


def test_a_follower_fetching_drops_entries_and_votes_and_answers_without_acknowledging() -> None:
    fetch, sent, calls = Fetch(), [], []
    catch_up = CatchUp(fetch, lambda: None)
    stand_in = core(sent, calls)
    catch_up.bind(stand_in)
    entries = {"type": "append_entries", "term": 5, "commit_index": 50, "prevLogIdx": 38,
               "prevLogTerm": 5, "entries": [(b"c", 39, 5)]}
    assert catch_up.screen("append_entries", entries) is entries  # not fetching: untouched
    assert catch_up.begin(Path("/raft/snapshot.1.tmp"))
    assert fetch.asked == ["/raft/snapshot.1.tmp"] and catch_up.fetching
    assert catch_up.screen("append_entries", entries) == {
        "type": "append_entries", "term": 5, "commit_index": 50}  # who leads, nothing more
    for kind in ("request_vote", PRE_VOTE, "timeout_now"):
        assert catch_up.screen(kind, {"type": kind, "term": 6}) is None
    assert catch_up.screen("next_node_idx", {"type": "next_node_idx"}) is not None
    catch_up.answer("leader", "append_entries")
    catch_up.answer("stranger", "append_entries")  # not the leader pysyncobj took it from
    assert sent == [("leader", {"success": False, "reset": False})]
    catch_up.before_tick()  # not fetched yet: the election timer restarted, nothing loaded
    assert stand_in._SyncObj__raftElectionDeadline > 0 and calls == []
    fetch.over = True
    catch_up.before_tick()
    assert calls == ["put /raft/snapshot.1.tmp", "load True"] and not catch_up.fetching
    assert sent[-1] == ("leader", {"success": True, "reset": False})  # where its log ends


def test_without_a_prefetch_a_snapshot_installs_at_once() -> None:
    catch_up = CatchUp(None, lambda: None)
    assert not catch_up.begin(Path("/raft/snapshot.1.tmp")) and not catch_up.fetching
