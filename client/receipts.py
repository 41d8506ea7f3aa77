"""What a consumer received, message by message, written down as it is taken: the receipts
the production audit sets against the ledgers (``tickwheel audit DIR --receipts FOLDER``,
docs/audit.md), the idea of LinkedIn's Chaperone applied per message.

A consumer given ``receipts_dir=`` (`tickwheel.client.Client.consume`, and the asyncio
client's) opens one file of its own there, ``receipts-<name>-<pid>-<random>.jsonl``
(``<name>``: the consumer's name, ``consumer`` when it has none, every character outside
``[A-Za-z0-9._-]`` made ``_``), appends one JSON line per message before handing it out, and
closes it with the consumer. A line: ``id``, ``topic``, ``group`` (``""``: the default
group), ``attempt``, ``possible_duplicate``, ``deliver_at_ms``, ``delivered_at_ms`` (the
cluster's time the leader sent it), ``received_ms`` (this process's clock, Unix ms),
``node`` (the sending leader's Raft address) and ``consumer``. Lines are flushed as written,
never fsynced: a killed process loses at most what its buffer held, and may tear its last
line (the audit skips it). The rule: a message is written down before the caller sees it, so
a receipt missing means the consumer never got the message.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import threading
import time
from pathlib import Path
from typing import IO, Final

from tickwheel.client._core import Received

_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]")


class ReceiptLog:
    """One consumer's receipts file (see the module docstring); safe to use from threads."""

    def __init__(self, folder: Path | str, consumer: str) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        name = _UNSAFE.sub("_", consumer or "consumer")
        self.path = folder / f"receipts-{name}-{os.getpid()}-{secrets.token_hex(4)}.jsonl"
        self._consumer = consumer
        self._lock = threading.Lock()
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8")

    def record(self, message: Received) -> None:
        """Append ``message``'s receipt (nothing once closed)."""
        line = json.dumps({
            "id": message.id, "topic": message.topic, "group": message.group,
            "attempt": message.attempt, "possible_duplicate": message.possible_duplicate,
            "deliver_at_ms": message.deliver_at_ms, "delivered_at_ms": message.delivered_at_ms,
            "received_ms": int(time.time() * 1000), "node": message.node,
            "consumer": self._consumer}, separators=(",", ":"))
        with self._lock:
            if self._file is not None:
                self._file.write(line + "\n")
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
