"""The delivery trail: one JSON line per event a node's dispatch produces.

The PySpark audit (`tickwheel.chaos.audit`) reads these files. Lines:
``{"event": "dispatch_started", ...}`` when this node starts dispatching (with the cursor it
starts from), and ``{"event": "delivered", ...}`` per message and attempt, written when the
message is sent to a consumer (with its consumer group and the number of its lease in that
group: above 1, an earlier lease may have reached a consumer).

Bounded: at half of ``max_bytes`` the file becomes ``<name>.1`` (replacing the one before) and a
new one is begun, so a node that runs for months keeps the last stretch of evidence and never
fills its disk with it (at 20,000 deliveries a second the trail grows ~6 MB/s). `files`
names both, oldest first. The trail is `TRAIL_FILE` in the node's data folder.
"""

from __future__ import annotations

import json
import logging
import os
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal, TextIO, TypedDict

from tickwheel.wheel import Cursor

if TYPE_CHECKING:
    from tickwheel.node.delivery.sent import Sent

log = logging.getLogger("tickwheel.node")

DEFAULT_TRAIL_MAX_BYTES: Final = 256 << 20
TRAIL_FILE: Final = "deliveries.jsonl"


class DispatchStarted(TypedDict):
    """A ``dispatch_started`` line: ``node`` began dispatching in ``term`` from ``cursor``
    (``[second, local_index]``)."""

    event: Literal["dispatch_started"]
    node: str
    term: int
    epoch: int
    cursor: list[int]
    takeover_ms: int


class Delivered(TypedDict):
    """A ``delivered`` line: one attempt of one message sent to a consumer of ``group``
    (``position`` is ``[slot_second, local_index]``, ``lease`` the lease's number)."""

    event: Literal["delivered"]
    node: str
    term: int
    group: str
    epoch: int
    id: str
    topic: str
    handle: int
    deliver_at_ms: int
    delivered_at_ms: int
    position: list[int]
    lease: int
    possible_duplicate: bool
    attempt: int


TrailEvent = DispatchStarted | Delivered
"""A line of the trail, told apart by its ``event``."""


def files(data: Path) -> list[Path]:
    """The trail files in a node's data folder that exist: the one rotated out, then the
    current one."""
    path = data / TRAIL_FILE
    return [p for p in (rotated(path), path) if p.exists()]


def rotated(path: Path) -> Path:
    return path.with_name(path.name + ".1")


class DeliveryTrail:
    """Appends events to ``path``; flushed after every batch (a crash loses at most the batch
    being written, which was not acknowledged and is sent again). One thread writes.
    ``max_bytes`` 0: nothing is written."""

    def __init__(self, path: Path, node: str, max_bytes: int = DEFAULT_TRAIL_MAX_BYTES
                 ) -> None:
        self._path = path
        self._node = node
        self._rotate_at = max_bytes // 2
        self._file: TextIO | None = None
        if max_bytes:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (owned)

    def dispatch_started(self, term: int, epoch: int, cursor: Cursor, takeover_ms: int) -> None:
        self._write([DispatchStarted(event="dispatch_started", node=self._node, term=term,
                                     epoch=epoch, cursor=list(cursor), takeover_ms=takeover_ms)])

    def delivered(self, batch: list[Sent], group: str, term: int) -> None:
        if self._file is None:
            return
        # The hottest line a leader writes (one per message sent): formatted by hand, since
        # json.dumps of a dict per message took a fifth of the event loop at 20,000 msg/s.
        # Only the id needs escaping (json's own C escaper, without json.dumps around it):
        # topics and groups are [A-Za-z0-9._-] (validation.TOPIC_PATTERN, GROUP_PATTERN).
        head = (f'{{"event":"delivered","node":{json.dumps(self._node)},"term":{term},'
                f'"group":"{group}","epoch":')
        self._file.write("".join(
            f'{head}{s.delivery.epoch},"id":{encode_basestring_ascii(s.delivery.message.id)},'
            f'"topic":"{s.delivery.message.topic}","handle":{s.delivery.message.handle},'
            f'"deliver_at_ms":{s.delivery.message.deliver_at_ms},'
            f'"delivered_at_ms":{s.delivered_at_ms},'
            f'"position":[{s.delivery.message.slot_second},{s.delivery.message.local_index}],'
            f'"lease":{s.delivery.lease.seq},'
            f'"possible_duplicate":{"true" if s.delivery.possible_duplicate else "false"},'
            f'"attempt":{s.attempt}}}\n'
            for s in batch))
        self._flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def _write(self, events: list[TrailEvent]) -> None:
        if self._file is None:
            return
        self._file.write("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events))
        self._flush()

    def _flush(self) -> None:
        assert self._file is not None
        self._file.flush()
        if self._file.tell() >= self._rotate_at:
            self._file.close()
            os.replace(self._path, rotated(self._path))
            self._file = open(self._path, "a", encoding="utf-8")  # noqa: SIM115 (owned)
            log.info("event=delivery_trail_rotated path=%s kept=%s bytes_each=%d",
                     self._path, rotated(self._path), self._rotate_at)
