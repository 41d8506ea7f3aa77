"""The delivery journal: one JSON line per event a node's dispatch produces.

The PySpark audit (issue 5) reads these files. Lines: ``{"event": "dispatch_started", ...}`` when
this node starts dispatching (with the cursor it starts from), and ``{"event": "delivered", ...}``
per message and attempt, written when the message is sent to a consumer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TextIO

from tickwheel.replication.dispatcher import Delivery
from tickwheel.wheel import Cursor


class DeliveryJournal:
    """Appends events to ``path``; flushed after every batch (a crash loses at most the batch
    being written, which was not acknowledged and is sent again). One thread writes."""

    def __init__(self, path: Path, node: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115 (owned)
        self._node = node

    def dispatch_started(self, term: int, epoch: int, cursor: Cursor, takeover_ms: int) -> None:
        self._write([{"event": "dispatch_started", "node": self._node, "term": term,
                      "epoch": epoch, "cursor": list(cursor), "takeover_ms": takeover_ms}])

    def delivered(self, attempts: list[tuple[Delivery, int]], term: int,
                  delivered_at_ms: int) -> None:
        self._write([{
            "event": "delivered", "node": self._node, "term": term, "epoch": d.epoch,
            "id": d.message.id, "topic": d.message.topic, "handle": d.message.handle,
            "deliver_at_ms": d.message.deliver_at_ms, "delivered_at_ms": delivered_at_ms,
            "position": list(d.message.position), "possible_duplicate": d.possible_duplicate,
            "attempt": attempt,
        } for d, attempt in attempts])

    def close(self) -> None:
        self._file.close()

    def _write(self, events: list[dict]) -> None:
        self._file.write("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events))
        self._file.flush()
