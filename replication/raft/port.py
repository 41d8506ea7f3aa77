"""The Raft port: what the replica needs of consensus, and nothing of how it is done.

`tickwheel.replication.raft.RaftNode` is the one implementation on real sockets (pysyncobj
inside); a test can drive a `tickwheel.replication.Replica` with any other object that has
these methods. Every method is called on the Raft thread unless it says otherwise.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from tickwheel.replication.raft.versions import MemberVersion


class Role(enum.Enum):
    FOLLOWER = 0
    CANDIDATE = 1
    LEADER = 2


@dataclass(frozen=True, slots=True)
class StepSummary:
    """The Raft thread's steps so far (`tickwheel.replication.raft.steps`): how many took at
    most each of ``bounds_ms`` (and above the last), their sum, and the longest lately."""

    bounds_ms: tuple[float, ...] = ()
    counts: tuple[int, ...] = ()
    sum_ms: float = 0.0
    longest_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class RaftStatus:
    role: Role
    term: int
    leader: str | None
    """The leader's Raft address, if known."""
    commit_index: int
    last_applied: int
    leader_commit_index: int
    """The leader's commit index as this node last heard it (0 if never)."""
    connected: tuple[str, ...]
    """Peers this node has an authenticated link to."""
    match_index: dict[str, int]
    """On the leader: the last entry each follower is known to hold."""
    steps: StepSummary = StepSummary()
    member_versions: dict[str, MemberVersion] = field(default_factory=dict)
    """Each peer's version as of its latest message (`raft.versions`): on the leader its
    followers', on a follower its leader's."""


@dataclass(frozen=True, slots=True)
class PeerClock:
    """What a leader knows of a peer's clock (Unix ms), from the peer's latest answer: at the
    leader's monotonic time ``t`` (s) the peer's clock read at least ``base_ms + t * 1000`` and
    at most ``error_ms`` more (the answer's round trip: the peer read its clock after the
    leader sent what it answers, and before the leader read the answer)."""

    base_ms: float
    error_ms: float
    heard_s: float
    """The leader's monotonic time when it read the answer."""


OnResult = Callable[[object, bool], None]
"""``on_result(result, committed)``: what applying a proposed command returned, and whether it
was committed (False: leadership was lost first, the command may or may not be applied)."""


class Prefetch(Protocol):
    """The state machine's side of a snapshot that a follower installs without stopping its
    Raft thread: the files it names are gathered first, off that thread, and pysyncobj's
    load of the snapshot (the deserializer) then only switches to them."""

    def prefetch(self, path: str, done: Callable[[], None]) -> None:
        """Begin to gather the files of the snapshot whole at ``path``; ``done()`` (from
        another thread) once `prefetched`."""

    def prefetched(self) -> bool:
        """Whether they are gathered, or could not be (the load then stops the node)."""


class Taking(Protocol):
    """The state machine's side of a snapshot taken without holding the Raft thread: begun in
    the step pysyncobj asks for it, carried a step further at each tick, and reported done
    only once it is durable and in place: pysyncobj then cuts its journal to it."""

    def begin(self, path: str, raft_tail: tuple[Any, ...]) -> None:
        """Capture a snapshot of the state (with Raft's part), to be put at ``path``."""

    def advance(self) -> bool | None:
        """None while it is under way; True once it is in place; False if it failed."""

    def void(self) -> None:
        """Drop the snapshot under way: one received from the leader replaced it."""


class RaftPort(Protocol):
    def tick(self, wait_s: float) -> None:
        """Send, receive, commit and apply; wait at most ``wait_s`` for a socket or `wake`."""

    def wake(self) -> None:
        """End `tick`'s wait early (any thread): what the caller queued before calling it is
        seen by the code that runs after that `tick` returns."""

    def propose(self, command: bytes, on_result: OnResult) -> None:
        """Append ``command`` to the log (leader only); ``on_result`` follows on this thread."""

    def is_leader(self) -> bool:
        """Whether this node leads now (any thread)."""

    def term(self) -> int: ...

    def leader(self) -> str | None:
        """The leader's Raft address, if known (any thread)."""

    def tenure_until_s(self, tenure_ms: int) -> float:
        """The ``time.monotonic()`` time until which this leader may act alone: ``tenure_ms``
        after a majority last answered it; 0 when not leading."""

    def peer_clocks(self) -> dict[str, PeerClock]:
        """On the leader: each peer's clock as of its latest answer (any thread; answers of
        any age, and of earlier leaderships: the caller judges their age)."""

    def compact(self) -> None:
        """Take a snapshot at the next opportunity."""

    def postpone_election(self) -> None:
        """Restart the election timer (after a long pause that was not the leader's fault)."""

    def status(self) -> RaftStatus:
        """Any thread."""

    def close(self) -> None: ...
