"""What the Raft layer writes to disk besides pysyncobj's own: a journal that reaches the disk
before an entry is acknowledged, and the snapshot file (a manifest, never message bodies)."""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path
from typing import Any

from pysyncobj.journal import FIRST_RECORD_OFFSET, LAST_RECORD_OFFSET_OFFSET, FileJournal

from tickwheel.replication.raft.link_protocol import safe_load

SNAPSHOT_CLASSES = frozenset({("pysyncobj.node", "TCPNode")})
"""What a snapshot file names besides plain data: pysyncobj's member list."""


class MsyncJournal(FileJournal):
    """A journal that reaches the disk before pysyncobj acknowledges an entry."""

    def add(self, command: bytes, idx: int, term: int) -> None:
        super().add(command, idx, term)
        self.flush()

    def setCurrentTerm(self, term: int, votedForNodeId: object) -> None:
        super().setCurrentTerm(term, votedForNodeId)
        meta = Path(self._FileJournal__metaStorer.getPath())
        fsync_files([meta, meta.parent])


def write_snapshot(path: str, manifest: object, raft_tail: tuple[Any, ...], fsync: bool
                   ) -> None:
    """Write the snapshot file pysyncobj renames into place (and streams to followers)."""
    with open(path, "wb") as file:
        pickle.dump((manifest, raft_tail), file, protocol=pickle.HIGHEST_PROTOCOL)
        if fsync:
            file.flush()
            os.fsync(file.fileno())


def read_snapshot(path: str) -> tuple[Any, tuple[Any, ...]]:
    """``(manifest, raft_tail)``: plain data and pysyncobj's member list; any other class
    named in the file is refused (the file comes from the leader)."""
    with open(path, "rb") as file:
        content = safe_load(file, SNAPSHOT_CLASSES)
    if not (isinstance(content, tuple) and len(content) == 2
            and isinstance(content[1], tuple)):
        raise ValueError(f"{path} is not a snapshot: {type(content).__name__}")
    return content[0], content[1]


def fsync_files(paths: list[Path]) -> None:
    """fsync each file (or folder: its entries)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def journal_first_index(path: Path) -> int | None:
    """The Raft index of the first entry in pysyncobj's journal file at ``path``, read without
    opening it for pysyncobj (which would create it); None if there is no file or no entry.
    A fresh journal starts at 1; a compacted one after the last snapshot."""
    try:
        with open(path, "rb") as file:
            header = file.read(FIRST_RECORD_OFFSET + 12)
    except FileNotFoundError:
        return None
    if len(header) < FIRST_RECORD_OFFSET + 12:
        return None
    (last_offset,) = struct.unpack_from("<I", header, LAST_RECORD_OFFSET_OFFSET)
    if last_offset <= FIRST_RECORD_OFFSET:
        return None
    (index,) = struct.unpack_from("<Q", header, FIRST_RECORD_OFFSET + 4)
    return int(index)
