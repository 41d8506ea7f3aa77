"""The leader's proposals in flight, and who waits for each one's result.

Every command the leader proposes (`tickwheel.replication.commands`) has someone waiting: a
group-commit `Entry` (many requests' messages) or a `Future`. Raft reports each proposal once:
applied (its result) or not committed (the leader lost its place). When leadership ends, every
proposal still in flight fails with `NotLeader` at once: its result may yet be applied by the
next leader, which a retry finds (the dedupe window), but nobody waits here for it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from tickwheel.common.errors import NotLeader
from tickwheel.replication.group_commit import Entry, resolve
from tickwheel.replication.raft import RaftPort

Applied = Future[Any]
"""Who waits for one applied command: it gets the state machine's answer, whose shape depends
on the kind of command (`StateMachine.apply`)."""


class Proposals:
    """Single-threaded (the Raft thread)."""

    def __init__(self, raft: RaftPort, leader_hint: Callable[[], str | None]) -> None:
        self._raft = raft
        self._leader_hint = leader_hint
        self._inflight: dict[int, Entry | Applied] = {}
        self._next_id = 0

    def propose(self, command: bytes, target: Entry | Applied) -> None:
        """Propose ``command``; ``target`` gets its result, or `NotLeader`."""
        proposal_id = self._next_id
        self._next_id += 1
        self._inflight[proposal_id] = target

        def on_result(result: object, committed: bool) -> None:
            if self._inflight.pop(proposal_id, None) is None:
                return  # already failed when leadership ended
            if committed:
                settle(target, result, None)
            else:
                settle(target, None, NotLeader(self._leader_hint()))
        self._raft.propose(command, on_result)

    def fail_all(self, error: BaseException) -> None:
        """Leadership ended: everyone still waiting gets ``error``."""
        inflight, self._inflight = self._inflight, {}
        for target in inflight.values():
            settle(target, None, error)


def settle(target: Entry | Applied, result: Any, error: BaseException | None) -> None:
    if isinstance(target, Entry):
        target.settle(result, error)
    else:
        resolve(target, result, error)
