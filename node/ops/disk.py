"""Free disk space: new messages are refused while any member's disk is below its reserve.

A node whose disk fills cannot append to its Raft journal nor file a message, and a state
machine cannot skip an entry: it must stop. So every member keeps ``min_free_bytes`` free for
what it must still write (the entries of hand-outs, acks and retries, the journal's next growth
step, a compaction's copy, snapshots), and the cluster stops *taking in* new messages
(Schedule, Reschedule: ``RESOURCE_EXHAUSTED``, naming the member and its figures) while any
member's free space is below its reserve. Delivery, acks, cancels and group changes go on;
scheduling comes back by itself once space returns. (etcd's ``NOSPACE`` alarm is the model:
one member out of space makes the whole cluster refuse writes that grow it.)

Each member measures the space under its data folder (``statvfs``, at most every
`OWN_MEASURE_S`) and answers `Peer.DiskSpace`; each asks every other member once every
`POLL_S`, so whichever node leads (or answers first, before forwarding) already knows. A
member that does not answer (stopped, or a build without `DiskSpace` during a rolling upgrade)
counts as having room: it appends nothing while it is away, and a restarted one is asked
within a second.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from tickwheel.common.errors import DiskLow
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.v1 import tickwheel_pb2_grpc as pb_grpc

log = logging.getLogger("tickwheel.node.ops.disk")

DEFAULT_RESERVE_BYTES = 128 << 20
"""``min_free_bytes`` by default: a journal growth step (32 MiB), a compaction's copy of the
journal (at most ``snapshot_min_bytes``, 32 MiB), and a few seconds of writes at full speed
(~10 MB/s) while the leader learns that a member's disk ran low."""
POLL_S = 1.0
"""How often a member asks the others for their free space."""
POLL_TIMEOUT_S = 0.5
REPORT_TTL_S = 5.0
"""A member's report counts this long (a member that stops answering counts as having room)."""
OWN_MEASURE_S = 0.1
"""A node measures its own disk at most this often (a ``statvfs`` per Schedule call would be
cheap, but the figure changes no faster)."""


@dataclass(frozen=True, slots=True)
class Space:
    """One member's disk, as it measured it."""

    member: str
    free_bytes: int
    reserve_bytes: int

    @property
    def low(self) -> bool:
        return self.free_bytes < self.reserve_bytes


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the file system holding ``path``."""
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


class DiskWatch:
    """This member's disk and the others' last reports; `check` raises `DiskLow` while any of
    them is below its reserve. Used from the event loop only."""

    def __init__(self, member: str, path: Path, reserve_bytes: int,
                 measure: Callable[[Path], int] = free_bytes,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.member = member
        self._path = path
        self.reserve_bytes = reserve_bytes
        self._measure = measure
        self._clock = clock
        self._own = Space(member, measure(path), reserve_bytes)
        self._measured_at = clock()
        self._reports: dict[str, tuple[Space, float]] = {}
        self._low: set[str] = set()
        self._log_change(self._own)

    def own(self) -> Space:
        """This member's space, measured at most `OWN_MEASURE_S` ago."""
        now = self._clock()
        if now - self._measured_at >= OWN_MEASURE_S:
            self._own = Space(self.member, self._measure(self._path), self.reserve_bytes)
            self._measured_at = now
            self._log_change(self._own)
        return self._own

    def note(self, space: Space) -> None:
        """A member's answer to `Peer.DiskSpace`."""
        self._reports[space.member] = (space, self._clock())
        self._log_change(space)

    def forget(self, member: str) -> None:
        """A member that did not answer: its last report stops counting."""
        if self._reports.pop(member, None) is not None and member in self._low:
            self._low.discard(member)
            log.info("event=disk_unknown member=%s it does not answer; it no longer holds "
                     "scheduling back", member)

    def spaces(self) -> list[Space]:
        """This member's space and every current report, this member first."""
        now = self._clock()
        return [self.own(), *(space for space, at in self._reports.values()
                              if now - at < REPORT_TTL_S)]

    def check(self) -> None:
        """Raise `DiskLow` naming the first member below its reserve, if any."""
        for space in self.spaces():
            if space.low:
                raise DiskLow(space.member, space.free_bytes, space.reserve_bytes)

    def _log_change(self, space: Space) -> None:
        if space.low and space.member not in self._low:
            self._low.add(space.member)
            log.warning("event=disk_low member=%s free_bytes=%d reserve_bytes=%d new messages "
                        "are refused (RESOURCE_EXHAUSTED) until space returns; stored ones are "
                        "still delivered", space.member, space.free_bytes, space.reserve_bytes)
        elif not space.low and space.member in self._low:
            self._low.discard(space.member)
            log.info("event=disk_ok member=%s free_bytes=%d reserve_bytes=%d", space.member,
                     space.free_bytes, space.reserve_bytes)


async def poll_peers(watch: DiskWatch, stubs: Mapping[str, Callable[[], pb_grpc.PeerAsyncStub]],
                     metadata: tuple[tuple[str, str], ...]) -> None:
    """Ask every other member for its space every `POLL_S`, for ever (cancel to stop).
    ``stubs`` maps each member's Raft address to how to reach its peer listener."""

    async def ask(member: str, stub: Callable[[], pb_grpc.PeerAsyncStub]) -> None:
        try:
            answer = await stub().DiskSpace(pb.DiskSpaceRequest(), timeout=POLL_TIMEOUT_S,
                                            metadata=metadata)
        except grpc.RpcError:
            watch.forget(member)
            return
        watch.note(Space(member, answer.free_bytes, answer.reserve_bytes))

    while True:
        await asyncio.gather(*(ask(member, stub) for member, stub in stubs.items()))
        await asyncio.sleep(POLL_S)
