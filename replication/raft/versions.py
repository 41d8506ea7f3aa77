"""The members' versions as each node sees them: every AppendEntries and every answer to one
carries the cluster version the sending node's build writes
(`tickwheel.common.versions.CURRENT`).

A node stamps every ``append_entries`` and ``next_node_idx`` it sends with `VERSION`; the
receiver takes the stamp off and notes the version and when it read it: the leader learns its
followers', a follower its leader's. A node of 0.0.4 sends no stamp (pysyncobj ignores keys
it does not know, and 0.0.4's does): its messages count as `BASELINE`.
``tickwheel upgrade finalize`` reads these notes (`older`): it is refused while a member
answered lately with an older version, or has not answered lately, or while the leader is
older. A stamp that is not a plausible integer is dropped and logged; the message then counts
as `BASELINE`, which only ever holds a finalize back.

The notes live in a dict that is replaced, never changed, so other threads read it without a
lock (as `tickwheel.replication.raft.clocks`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from tickwheel.common.versions import BASELINE, CURRENT, describe

log = logging.getLogger("tickwheel.replication")

VERSION = "tickwheel_version"
"""On an ``append_entries`` or a ``next_node_idx``: the cluster version the sender's build
writes."""
STAMPED = frozenset({"append_entries", "next_node_idx"})
MAX_VERSION = 1 << 16
"""No plausible cluster version reaches this."""


class MemberVersion(NamedTuple):
    """A member's version as of its latest answer, and when the leader read it
    (``time.monotonic()``)."""

    version: int
    heard_s: float


class MemberVersions:
    """The version stamps of one node, as follower (`outgoing`) and as leader (`incoming`)."""

    def __init__(self, version: int = CURRENT,
                 clock_s: Callable[[], float] = time.monotonic) -> None:
        self._version = version
        self._clock_s = clock_s
        self.heard: dict[str, MemberVersion] = {}
        """Peer address -> its latest answer's version; replaced whole on every change."""

    def outgoing(self, message: dict[str, Any]) -> None:
        if message.get("type") in STAMPED:
            message[VERSION] = self._version

    def incoming(self, node: object, message: dict[str, Any]) -> None:
        if message.get("type") not in STAMPED:
            return
        version = message.pop(VERSION, BASELINE)
        if type(version) is not int or not BASELINE <= version < MAX_VERSION:
            log.warning("event=raft_message_malformed type=%s peer=%s field=%s value=%r",
                        message.get("type"), node, VERSION, repr(version)[:40])
            version = BASELINE
        address = str(getattr(node, "address", node))
        self.heard = {**self.heard, address: MemberVersion(version, self._clock_s())}


def older(heard: dict[str, MemberVersion], peers: Sequence[str], version: int,
          within_s: float, now_s: float) -> str | None:
    """Why the members ``peers`` may not be held to ``version`` yet, naming the first member
    that answered lately with an older one or has not answered within ``within_s``; None
    when every one answered lately with ``version`` or newer."""
    for peer in peers:
        seen = heard.get(peer)
        if seen is None or now_s - seen.heard_s > within_s:
            return (f"member {peer} has not answered the leader within {within_s:.1f} s: its "
                    "version is not known; finalize once every member runs and follows")
        if seen.version < version:
            return (f"member {peer} runs a release that writes cluster version "
                    f"{describe(seen.version)}, not {describe(version)}: upgrade it first")
    return None
