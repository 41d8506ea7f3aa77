"""What a node's ledger keeps: closed segments by age and by bytes, and never the disk space
the node keeps for its own writes.

After each segment it closes (and at start) the ledger deletes its oldest closed segments (each
with its manifest and its index) while the oldest is older than ``max_age_s`` (by the time its
file was last written), and while all of them (with their indexes) take more than
``max_bytes``. The newest segment is always kept, so sequence numbers continue after a restart
and are never reused. A segment deleted is counted by reason.

A low disk deletes nothing: `room_for_segment` (the node's reserve, ``min_free_bytes`` of
`tickwheel.node.ops.disk`, plus one more segment) is what the writer asks before it begins a
segment and before each write, and while it answers False the ledger writes nothing and counts
the rows it drops (``disk_low``), so the ledger never takes the space the Raft journal needs.
Deleting the evidence it holds would not give that space back for long (a disk filled by
something else stays full), and a chaos run's ``disk-full`` fault erased a leader's earlier
terms that way. Called from the
ledger's thread only (`tickwheel.node.ledger.writer`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tickwheel.node.ledger.index import index_path
from tickwheel.node.ledger.schema import manifest_path, segments

log = logging.getLogger("tickwheel.node.ledger")

FreeBytes = Callable[[Path], int]
"""Bytes still free on the file system holding a path (`tickwheel.node.ops.disk.free_bytes`)."""


@dataclass(frozen=True, slots=True)
class Retention:
    max_age_s: int
    max_bytes: int
    reserve_bytes: int
    """The node's ``min_free_bytes``."""
    max_segment_bytes: int
    free_bytes: FreeBytes


def room_for_segment(folder: Path, retention: Retention) -> bool:
    """Whether the disk holds the node's reserve and one more segment."""
    return retention.free_bytes(folder) >= retention.reserve_bytes + retention.max_segment_bytes


def enforce(folder: Path, retention: Retention, now_ms: int) -> tuple[list[tuple[Path, str]], int]:
    """Delete the oldest closed segments as the module docstring says; returns each deleted
    with its reason (``age``, ``bytes``), and the bytes of those kept."""
    kept = [(path, path.stat()) for path in segments(folder)]
    deleted: list[tuple[Path, str]] = []
    indexes = {path: _size(index_path(path)) for path, _ in kept}
    total = sum(stat.st_size + indexes[path] for path, stat in kept)
    oldest_ms = now_ms - retention.max_age_s * 1000
    while len(kept) > 1:
        path, stat = kept[0]
        if stat.st_mtime * 1000 < oldest_ms:
            reason = "age"
        elif total > retention.max_bytes:
            reason = "bytes"
        else:
            break
        _delete(path)
        deleted.append((path, reason))
        total -= stat.st_size + indexes[path]
        kept.pop(0)
    return deleted, total


def _size(path: Path) -> int:
    """A file's size, 0 if there is none."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _delete(segment: Path) -> None:
    for path in (segment, manifest_path(segment), index_path(segment)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    log.info("event=ledger_segment_deleted path=%s", segment)
