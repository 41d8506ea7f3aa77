"""Group commit: many concurrent schedule requests become few Raft entries.

pysyncobj makes one log entry per call, and a call costs the same whether it carries one message
or five hundred, so throughput is set by how many messages share an entry. Requests queue here
(from any thread); the Raft thread drains the queue and packs the messages, in arrival order,
into entries of at most ``max_entry_bytes`` (a single larger message gets an entry of its own).
While entries are in flight, new requests gather for the next ones: under load, batching comes
for free; a lone request wakes the Raft thread and is proposed at once, unless the thread's
next turn comes within ``schedule_linger_ms`` anyway (`Replica._wake_for_schedules`: while
messages come due, the next dispatch step), which then proposes it with the step's handout.

The replica keeps two committers: one for schedule commands and one for reschedule commands
(retry copies of nacked messages); the parts differ, the packing does not. A schedule request
carries its caller's principal: an entry says whose its messages are in runs, one per request
(`Entry.runs`, `tickwheel.replication.principals`), and counts a run's bytes in its size.

A request's messages may span entries; its future resolves when the last of them is applied,
with one result per message in order. If any part fails (leadership lost), the whole request
fails with `NotLeader`: parts already applied are kept, and a retry with the same ids returns
their original results (the dedupe window).
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from tickwheel.common.errors import MapChanged, Overloaded
from tickwheel.replication import commands
from tickwheel.replication.principals import SECTION_BYTES, Runs, run_bytes


@dataclass(eq=False, slots=True)
class _Request:
    parts: list[bytes]
    future: Future[Any]
    results: list[object] = field(default_factory=list)
    missing: int = 0
    failed: bool = False
    map_version: int = 0
    principal: str = ""


@dataclass(slots=True)
class Entry:
    """One (re)schedule command to propose, and which requests' messages it carries."""

    parts: list[bytes]
    owners: list[tuple[_Request, int, int]]  # (request, first result index, count)

    def runs(self) -> Runs | None:
        """Whose the parts are, in order; None when no request names a principal."""
        if not any(request.principal for request, _, _ in self.owners):
            return None
        return [(request.principal, count) for request, _, count in self.owners]

    def settle(self, results: list[object] | None, error: BaseException | None) -> None:
        """Hand each owner its slice of ``results`` (or the error)."""
        offset = 0
        for request, start, count in self.owners:
            offset += count
            if request.failed:
                continue
            if error is not None or results is None:
                request.failed = True
                resolve(request.future, error=error)
                continue
            request.results[start:start + count] = results[offset - count:offset]
            request.missing -= count
            if request.missing == 0:
                resolve(request.future, request.results)


class GroupCommitter:
    """Thread-safe queue of (re)schedule requests, drained into entries by the Raft thread."""

    def __init__(self, max_entry_bytes: int, max_queued_msgs: int,
                 wake: Callable[[], None], principals: bool = False) -> None:
        """``principals``: entries may carry their requests' principals (count their bytes)."""
        self._max_entry_bytes = max_entry_bytes
        self._principals = principals
        self._overhead_bytes = commands.SCHEDULE_OVERHEAD_BYTES + (SECTION_BYTES if principals
                                                                   else 0)
        self._max_queued_msgs = max_queued_msgs
        self._wake = wake
        self._lock = threading.Lock()
        self._queue: deque[_Request] = deque()
        self._queued_msgs = 0

    @property
    def queued_msgs(self) -> int:
        return self._queued_msgs

    def submit(self, parts: list[bytes], map_version: int = 0, principal: str = "") -> Future[Any]:
        """Queue one request of `commands.encoded_message` (or `commands.encoded_retry`) parts;
        its future gets the results. ``map_version``: the shard map the messages were placed
        by (`drain`); ``principal``: who asked (``""``: nobody named).
        Raises `Overloaded` when ``max_queued_msgs`` are already waiting."""
        future: Future[Any] = Future()
        if not parts:
            future.set_result([])
            return future
        request = _Request(parts, future, [None] * len(parts), len(parts),
                           map_version=map_version, principal=principal)
        with self._lock:
            if self._queued_msgs + len(parts) > self._max_queued_msgs and self._queue:
                raise Overloaded("max_queued_msgs")
            self._queue.append(request)
            self._queued_msgs += len(parts)
        self._wake()
        return future

    def drain(self, map_version: int = 0) -> list[Entry]:
        """Everything queued, packed into entries; a request placed by a shard map older than
        ``map_version`` (the newest proposed) fails with `MapChanged` instead: it was checked
        before the map changed and would be applied after."""
        with self._lock:
            queued, self._queue = list(self._queue), deque()
            self._queued_msgs = 0
        requests = []
        for request in queued:
            if request.map_version < map_version:
                resolve(request.future, error=MapChanged(map_version))
            else:
                requests.append(request)
        entries: list[Entry] = []
        parts: list[bytes] = []
        owners: list[tuple[_Request, int, int]] = []
        size = self._overhead_bytes
        for request in requests:
            start = 0
            run = run_bytes(request.principal) if self._principals else 0
            size += run
            for index, part in enumerate(request.parts):
                if parts and size + len(part) > self._max_entry_bytes:
                    if index > start:
                        owners.append((request, start, index - start))
                    entries.append(Entry(parts, owners))
                    parts, owners, start = [], [], index
                    size = self._overhead_bytes + run
                parts.append(part)
                size += len(part)
            owners.append((request, start, len(request.parts) - start))
        if parts:
            entries.append(Entry(parts, owners))
        return entries

    def fail_all(self, error: BaseException) -> None:
        """Fail everything queued (this node stopped being the leader)."""
        with self._lock:
            requests, self._queue = list(self._queue), deque()
            self._queued_msgs = 0
        for request in requests:
            resolve(request.future, error=error)


def resolve(future: Future[Any], result: object = None, error: BaseException | None = None) -> None:
    """Give ``future`` its result or error, unless its caller gave up on it: a gRPC call that
    is cancelled cancels the future it awaits, from the event loop's thread, at any moment."""
    with contextlib.suppress(InvalidStateError):
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
