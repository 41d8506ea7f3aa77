"""A follower catching up by snapshot goes on stepping while the snapshot's files are fetched.

pysyncobj installs a snapshot the moment its last chunk arrives, inside the tick that reads
it: the deserializer cuts, deletes and fetches every state file the snapshot names, and the
Raft thread answered nothing meanwhile (1.2-1.3 s for 750 files in a chaos run). Here the
snapshot received whole (and newer than what this node applied) is held staged, the
state machine gathers its files on a thread of its own (`Prefetch`), and pysyncobj loads it
(the deserializer only switches to the gathered files) in the first tick after they are.

Meanwhile the follower holds its log and its state as they were, and says so:

- *it applies nothing and takes no snapshot of its own* (`RaftNode`'s core asks
  `fetching`): the files it holds do not change while they are gathered;
- *it answers its leader's AppendEntries* with what pysyncobj itself answers a chunk of a
  snapshot: no success, no reset (``next_node_idx``), which the leader counts as an answer
  (its tenure, its fallback timer) and nothing else. The entries are dropped: the follower
  neither stores nor acknowledges what it does not hold, and the leader, which sends ahead,
  is not sent back to the snapshot by a refusal (the loop of docs/replication.md, "A late
  answer does not send a follower back"). pysyncobj still reads the message's term and
  leader and restarts its election timer; a snapshot chunk does not move the commit index
  (`RaftNode._hold_commit`);
- *it neither stands nor votes*: its election timer is restarted every tick, and vote
  requests, PreVote requests and TimeoutNow are dropped (as if lost: its log is about to
  change under it);
- once the files are gathered, the snapshot is put in place, pysyncobj loads it (the journal
  is cleared to the snapshot's last two entries) and the follower tells its leader where its
  log now ends; the leader's next AppendEntries, sent ahead, is refused with a reset to
  there, and it sends the entries that follow (or, if it compacted past them, its newer
  snapshot).

Called by `RaftNode` on the Raft thread; `begin` by its `ReceivingSerializer`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pysyncobj import SyncObj
from pysyncobj.monotonic import monotonic as raft_clock_s

from tickwheel.replication.raft.port import Prefetch
from tickwheel.replication.raft.prevote import PRE_VOTE

log = logging.getLogger("tickwheel.replication")

UNHEARD = frozenset({"request_vote", PRE_VOTE, "timeout_now"})
"""What a follower fetching a snapshot's files drops."""
KEPT = ("type", "term", "commit_index")
"""What pysyncobj sees of an AppendEntries meanwhile: who leads, in which term."""


class CatchUp:
    """The snapshot of one node whose files are being gathered, if any."""

    def __init__(self, prefetch: Prefetch | None, wake: Callable[[], None]) -> None:
        self._prefetch = prefetch
        self._wake = wake
        self._core: SyncObj | None = None
        self._staged: Path | None = None
        self._began_s = 0.0

    def bind(self, core: SyncObj) -> None:
        self._core = core

    @property
    def fetching(self) -> bool:
        return self._staged is not None

    def begin(self, staged: Path) -> bool:
        """The serializer's offer of a snapshot received whole at ``staged``: True when it is
        taken, to be loaded once its files are gathered (False without a `Prefetch`: then
        pysyncobj installs it at once, as a restart does)."""
        if self._prefetch is None:
            return False
        self._began_s = time.monotonic()
        self._prefetch.prefetch(str(staged), self._wake)  # if it raises, nothing was taken
        self._staged = staged
        return True

    def screen(self, kind: str | None, message: dict[str, Any]) -> dict[str, Any] | None:
        """What pysyncobj may read of ``message`` (None: nothing) while the files are
        gathered; ``message`` itself otherwise."""
        if self._staged is None:
            return message
        if kind in UNHEARD:
            return None
        if kind == "append_entries":
            return {name: message[name] for name in KEPT if name in message}
        return message

    def answer(self, node: object, kind: str | None) -> None:
        """After pysyncobj read an AppendEntries (screened) from ``node``: while the files are
        gathered, answer the leader it took it from, with neither success nor reset."""
        core = self._core
        if self._staged is None or kind != "append_entries" or core is None:
            return
        if core._SyncObj__raftLeader == node:
            core._SyncObj__sendNextNodeIdx(node, success=False, reset=False)

    def before_tick(self) -> None:
        """While the files are gathered, keep the election timer from running out; once they
        are, let pysyncobj load the snapshot and tell the leader where the log ends."""
        core, staged = self._core, self._staged
        if staged is None or core is None or self._prefetch is None:
            return
        if not self._prefetch.prefetched():
            core._SyncObj__raftElectionDeadline = (  # pysyncobj's clock
                raft_clock_s() + core._SyncObj__generateRaftTimeout())
            return
        self._staged = None
        core._SyncObj__serializer.put_in_place(staged)
        core._SyncObj__loadDumpFile(clearJournal=True)
        leader = core._SyncObj__raftLeader
        if leader is not None:
            core._SyncObj__sendNextNodeIdx(leader, success=True)
        log.info("event=snapshot_caught_up last_index=%d fetched_for_ms=%.1f",
                 core._SyncObj__getCurrentLogIndex(), (time.monotonic() - self._began_s) * 1000)
