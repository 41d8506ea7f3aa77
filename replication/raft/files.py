"""What the Raft layer writes to disk, where pysyncobj's own writing is not safe enough: a
journal compacted atomically (and, with ``fsync``, that reaches the disk before an entry is
acknowledged and never drops entries before the snapshot that holds them is durable), and the
snapshot file (a manifest, never message bodies)."""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path
from typing import Any

from pysyncobj.journal import (
    FIRST_RECORD_OFFSET,
    LAST_RECORD_OFFSET_OFFSET,
    FileJournal,
    ResizableFile,
)

from tickwheel.replication.raft.link_protocol import safe_load

SNAPSHOT_CLASSES = frozenset({("pysyncobj.node", "TCPNode")})
"""What a snapshot file names besides plain data: pysyncobj's member list."""


SNAPSHOT_FILE = "snapshot"
"""pysyncobj's full dump file, beside the journal in the Raft folder."""
_COMPACTING_SUFFIX = ".compacting"


class AtomicJournal(FileJournal):
    """pysyncobj's journal file, compacted by writing the entries it keeps to a new file and
    renaming it into place. pysyncobj rewrites the file in place from its first byte (``clear``
    then one ``add`` per kept entry, each moving the header's end mark), so a process killed
    part way left a journal missing entries it had acknowledged; after a rename the journal is
    the old one or the new one, whole."""

    sync = False
    """Whether files and the folder are fsynced (`MsyncJournal`)."""
    # FileJournal's private state, which a compaction replaces (pinned: tests/replication/
    # test_raft.py checks the seam)
    _FileJournal__journal: list[tuple[bytes, int, int]]
    _FileJournal__journalFile: ResizableFile
    _FileJournal__currentOffset: int

    def __init__(self, journalFile: str) -> None:
        leftover = Path(journalFile + _COMPACTING_SUFFIX)
        leftover.unlink(missing_ok=True)  # a compaction that never reached its rename
        super().__init__(journalFile)
        self._path = Path(journalFile)

    def deleteEntriesTo(self, entryTo: int) -> None:
        self._snapshot_durable()
        kept = self._FileJournal__journal[entryTo:]
        header = bytearray(self._FileJournal__getDefaultHeader())
        body = b"".join(_journal_record(*entry) for entry in kept)
        end = FIRST_RECORD_OFFSET + len(body)
        struct.pack_into("<I", header, LAST_RECORD_OFFSET_OFFSET, end)
        staged = self._path.with_name(self._path.name + _COMPACTING_SUFFIX)
        with open(staged, "wb") as file:
            file.write(header)
            file.write(body)
            if self.sync:
                file.flush()
                os.fsync(file.fileno())
        _close_unsynced(self._FileJournal__journalFile)
        os.replace(staged, self._path)
        if self.sync:
            fsync_files([self._path.parent])
        self._FileJournal__journalFile = ResizableFile(str(self._path))
        self._FileJournal__journal = list(kept)
        self._FileJournal__currentOffset = end

    def clear(self) -> None:
        """Called when a snapshot from the leader replaces the log: that snapshot must be on
        disk before the entries it replaces are gone."""
        self._snapshot_durable()
        super().clear()

    def _snapshot_durable(self) -> None:
        """With ``sync``: fsync the snapshot file and the folder (its rename) before the
        journal forgets what the snapshot now holds. pysyncobj renames a snapshot into place
        without either; a power cut could pair the old snapshot with a compacted journal."""
        if self.sync:
            snapshot = self._path.with_name(SNAPSHOT_FILE)
            fsync_files([*([snapshot] if snapshot.exists() else []), self._path.parent])


class MsyncJournal(AtomicJournal):
    """A journal that reaches the disk before pysyncobj acknowledges an entry."""

    sync = True

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


def _journal_record(command: bytes, idx: int, term: int) -> bytes:
    """One entry as pysyncobj's journal stores it: size, index, term, command, size."""
    data = struct.pack("<QQ", idx, term) + command
    size = struct.pack("<I", len(data))
    return size + data + size


def _close_unsynced(journal_file: ResizableFile) -> None:
    """Close a journal file that is being replaced without ``msync``: its pages are about to
    belong to no file, and ``ResizableFile._destroy`` would write back tens of MiB of them on
    the Raft thread first (measured: 5 % fewer schedules a second)."""
    journal_file._ResizableFile__mm.close()
    journal_file._ResizableFile__f.close()
