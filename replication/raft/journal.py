"""pysyncobj's journal, where its own writing is not safe enough: compacted atomically,
allocated on disk before it is written (a full disk is ``ENOSPC``, never SIGBUS), keeping the
entries a follower takes again until one differs, and, with ``fsync``, on disk before an entry
is acknowledged, with its term and vote, never dropping entries before the snapshot that holds
them is durable."""

from __future__ import annotations

import errno
import logging
import mmap
import os
import struct
from collections import deque
from pathlib import Path
from typing import Any, cast

from pysyncobj.journal import (
    FIRST_RECORD_OFFSET,
    LAST_RECORD_OFFSET_OFFSET,
    FileJournal,
    MetaStorer,
    ResizableFile,
)
from pysyncobj.pickle import dumps

from tickwheel.replication.raft.durability import SyncLedger, fsync_files, fsync_written
from tickwheel.replication.raft.snapshot import SNAPSHOT_FILE, SnapshotDamaged, read_snapshot

log = logging.getLogger("tickwheel.replication")

JOURNAL_FILE = "journal"
"""pysyncobj's journal file, in the Raft folder (its term and vote: ``journal.meta``)."""
_COMPACTING_SUFFIX = ".compacting"
GROWTH_STEP_MAX = 32 << 20
"""The journal file grows by doubling, but by at most this much at a time (the space is
allocated on disk at once; pysyncobj doubled without bound)."""
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
"""The errors of a write that found no space (the disk, or the user's quota)."""


class JournalFile:
    """The journal's file, mapped into memory as pysyncobj's ``ResizableFile`` maps it, except
    that every byte the map covers is allocated on disk first (``posix_fallocate``). pysyncobj
    grows the file with ``ftruncate``, which allocates nothing: on a full disk the first write
    to a new page killed the process with SIGBUS (exit 135, no word why). Here growth
    that finds no space raises ``OSError(ENOSPC)`` before anything is written."""

    def __init__(self, path: str, default_content: bytes) -> None:
        if not os.path.exists(path):
            with open(path, "wb") as file:
                file.write(default_content)
        self._file = open(path, "r+b")  # noqa: SIM115 (held open: the map needs it)
        size = os.fstat(self._file.fileno()).st_size
        # a file pysyncobj grew has holes; writing into one can fault as a new page would
        os.posix_fallocate(self._file.fileno(), 0, size)
        self._map = mmap.mmap(self._file.fileno(), size)

    def reserve(self, end: int) -> None:
        """Make the file (allocated on disk) and the map reach ``end``: double, by at most
        `GROWTH_STEP_MAX`, or grow by just what is needed when the step does not fit."""
        size = len(self._map)  # the map covers the file; ``size()`` would be an fstat a write
        if end <= size:
            return
        target = max(end, size + min(size, GROWTH_STEP_MAX))
        try:
            os.posix_fallocate(self._file.fileno(), size, target - size)
        except OSError as error:
            if error.errno not in DISK_FULL or target == end:
                raise
            target = end
            os.posix_fallocate(self._file.fileno(), size, target - size)
        self._map.resize(target)

    def write(self, offset: int, values: bytes) -> None:
        self.reserve(offset + len(values))
        self._map[offset:offset + len(values)] = values

    def read(self, offset: int, size: int) -> bytes:
        return self._map[offset:offset + size]

    def flush(self) -> None:
        self._map.flush()

    def fileno(self) -> int:
        return self._file.fileno()

    def _destroy(self) -> None:
        self._map.flush()
        self.close_unsynced()

    def close_unsynced(self) -> None:
        """Close without ``msync``: for a file that is being replaced, whose pages are about
        to belong to no file (writing back tens of MiB of them on the Raft thread first cost
        5 % of the schedules a second)."""
        self._map.close()
        self._file.close()


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
    _FileJournal__journalFile: ResizableFile | JournalFile
    _FileJournal__currentOffset: int

    def __init__(self, journalFile: str, ledger: SyncLedger | None = None) -> None:
        """``ledger``: where to note what each sync made durable (with ``sync`` only)."""
        self._path = Path(journalFile)
        self._ledger = ledger
        leftover = Path(journalFile + _COMPACTING_SUFFIX)
        leftover.unlink(missing_ok=True)  # a compaction that never reached its rename
        if self._path.exists() and self._path.stat().st_size < FIRST_RECORD_OFFSET:
            # created, and cut by a power cut before its header reached the disk: it never
            # held an entry (pysyncobj cannot map an empty file)
            log.warning("event=journal_empty path=%s bytes=%d: shorter than its header, "
                        "started again", journalFile, self._path.stat().st_size)
            self._path.unlink()
        super().__init__(journalFile)  # reads the entries through its own ResizableFile
        # pysyncobj's map, which read the entries; nothing was written through it
        _close_unsynced(cast(ResizableFile, self._FileJournal__journalFile))
        self._file = JournalFile(journalFile, self._FileJournal__getDefaultHeader())
        self._FileJournal__journalFile = self._file
        self._kept: deque[tuple[bytes, int, int]] = deque()
        """Entries after pysyncobj's last that the file still holds (`deleteEntriesFrom`)."""
        if self.sync:
            # the file pysyncobj may just have created, and what was read from it
            self._msync()
            fsync_files([self._path.parent])
            self._FileJournal__metaStorer = DurableMetaStorer(journalFile + ".meta", ledger)
        self._finish_compaction()

    def add(self, command: bytes, idx: int, term: int) -> None:
        """An entry equal to the next one the file kept (`deleteEntriesFrom`) is taken as it
        is; any other ends what was kept. Room for a new entry is allocated first: an entry
        that finds no space raises ``OSError(ENOSPC)`` and changes nothing (pysyncobj lists
        it before writing it)."""
        if self._kept:
            if self._kept[0] == (command, idx, term):
                self._kept.popleft()
                self._FileJournal__journal.append((command, idx, term))
                self._FileJournal__currentOffset += _RECORD_OVERHEAD + len(command)
                return
            self._kept.clear()  # a different entry: the file's end moves back to it
        self._file.reserve(self._FileJournal__currentOffset + _RECORD_OVERHEAD + len(command))
        super().add(command, idx, term)

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        """Drop the entries from ``entryFrom`` on from the list pysyncobj reads, but keep them
        in the file until an entry that differs takes their place (`add`).

        A pysyncobj follower drops every entry after the leader's ``prevLogIdx`` before adding
        the leader's entries, even the ones it holds already, and the leader sends such
        overlapping batches whenever a reply is behind its optimistic next index (several
        times a minute under load: pysyncobj's "truncating already-applied log entries").
        Cutting them from the file left entries this node had acknowledged, and the leader
        had counted, nowhere on its disk until they came again: the chaos runner's power
        cut there lost acknowledged messages, and a kill there could. Raft drops entries only
        where they conflict with the leader's."""
        removed = self._FileJournal__journal[entryFrom:]
        if not removed:
            return
        del self._FileJournal__journal[entryFrom:]
        self._FileJournal__currentOffset -= sum(_RECORD_OVERHEAD + len(command)
                                                for command, _, _ in removed)
        self._kept.extendleft(reversed(removed))

    def deleteEntriesTo(self, entryTo: int) -> None:
        """Drop the entries before ``entryTo`` (pysyncobj's cut to its snapshot), unless the
        journal no longer reaches it: then nothing is cut, and the next snapshot's cut
        catches up.

        pysyncobj cuts at the tick after it took its snapshot; in between, the journal can
        end before the snapshot's index. A follower takes the leader's entries again from an
        earlier index (`deleteEntriesFrom`: the list ends there until the rest of the
        leader's batches arrive, often several ticks later under load), or a snapshot
        received meanwhile replaced the journal with its own two entries. Cut anyway, the
        journal was emptied (the node died on its next look at the log) or the node stopped
        on a broken invariant (``compacting to entry 125 of 100``). Keeping the entries is
        always safe: the snapshot holds them; a journal that begins before its snapshot is
        cut to it at the next start (`_finish_compaction`), and pysyncobj replaces one that
        ends before it with the snapshot's two entries."""
        entries = len(self._FileJournal__journal)
        if entryTo >= entries:
            log.warning("event=journal_cut_deferred path=%s cut_to=%d entries=%d: the journal "
                        "no longer reaches this snapshot's index (taken again from the leader, "
                        "or replaced by a received snapshot); the next snapshot cuts it",
                        self._path, entryTo, entries)
            return
        self._snapshot_durable()
        kept = self._FileJournal__journal[entryTo:]
        header = bytearray(self._FileJournal__getDefaultHeader())
        body = b"".join(_journal_record(*entry) for entry in kept)
        end = FIRST_RECORD_OFFSET + len(body)
        body += b"".join(_journal_record(*entry) for entry in self._kept)
        struct.pack_into("<I", header, LAST_RECORD_OFFSET_OFFSET, FIRST_RECORD_OFFSET + len(body))
        staged = self._path.with_name(self._path.name + _COMPACTING_SUFFIX)
        try:
            with open(staged, "wb") as file:
                file.write(header)
                file.write(body)
                if self.sync:
                    fsync_written(file, self._ledger)
        except OSError:
            staged.unlink(missing_ok=True)  # no space for it: the old journal stays
            raise
        self._file.close_unsynced()
        os.replace(staged, self._path)
        if self.sync:
            fsync_files([self._path.parent])
        self._file = JournalFile(str(self._path), bytes(header))
        self._FileJournal__journalFile = self._file
        self._FileJournal__journal = list(kept)
        self._FileJournal__currentOffset = end

    def _finish_compaction(self) -> None:
        """Make the journal begin where the snapshot beside it ends, as the compaction after
        that snapshot would have, when the journal still holds the entries before.

        pysyncobj renames its snapshot into place and cuts the journal to it at its next
        tick. A node killed in between (a SIGKILL is enough) found a journal that does not
        begin with the snapshot's last two entries, and pysyncobj, loading the snapshot,
        then replaced the whole journal with those two: every entry after the snapshot,
        entries this node had acknowledged and the leader had counted, was gone from it, and
        from the cluster if the node then won an election (the likeliest cause of the
        power-cut test's one CI failure). Entries of the same index and term are the same
        entries (Raft's log matching), so those before the snapshot's are dropped and the
        rest kept. A snapshot that does not read is left to the snapshot's own check, which
        refuses to start."""
        journal = self._FileJournal__journal
        snapshot = self._path.with_name(SNAPSHOT_FILE)
        if len(journal) < 3 or not snapshot.exists():
            return
        try:
            last, before = read_snapshot(str(snapshot))[1][:2]
            start = before[1] - journal[0][1]
        except (SnapshotDamaged, OSError, ValueError, TypeError, IndexError):
            return
        if not (isinstance(start, int) and 0 < start < len(journal) - 1
                and journal[start] == before and journal[start + 1] == last):
            return
        log.warning("event=journal_compaction_finished path=%s first_index=%d "
                    "snapshot_index=%d entries_dropped=%d entries_kept=%d: the node stopped "
                    "after its snapshot and before cutting its journal to it", self._path,
                    journal[0][1], last[1], start, len(journal) - start)
        self.deleteEntriesTo(start)

    def clear(self) -> None:
        """Called when a snapshot from the leader replaces the log: that snapshot must be on
        disk before the entries it replaces are gone."""
        self._snapshot_durable()
        super().clear()
        self._kept.clear()

    def _snapshot_durable(self) -> None:
        """With ``sync``: fsync the snapshot file and the folder (its rename) before the
        journal forgets what the snapshot now holds. pysyncobj renames a snapshot into place
        without either; a power cut could pair the old snapshot with a compacted journal."""
        if self.sync:
            snapshot = self._path.with_name(SNAPSHOT_FILE)
            fsync_files([*([snapshot] if snapshot.exists() else []), self._path.parent],
                        self._ledger)

    def _msync(self) -> None:
        """Write the journal's mapped pages to disk (``msync``); note its end (the header's
        end mark: it covers the entries kept after pysyncobj's last)."""
        self._file.flush()
        if self._ledger is not None:
            (end,) = struct.unpack("<I", self._file.read(LAST_RECORD_OFFSET_OFFSET, 4))
            self._ledger.note(self._file.fileno(), end)


class MsyncJournal(AtomicJournal):
    """A journal that reaches the disk before pysyncobj acknowledges an entry, with its term
    and vote (`DurableMetaStorer`)."""

    sync = True

    def add(self, command: bytes, idx: int, term: int) -> None:
        super().add(command, idx, term)
        self._msync()


class DurableMetaStorer(MetaStorer):
    """pysyncobj's term-and-vote file, written so that a power cut leaves the old one or the
    new one. pysyncobj writes a temporary file and renames it over the old one without an
    fsync: the rename can reach the disk before the bytes do, and an empty file reads as term
    0 with no vote (its reader swallows every error), so a restarted node could vote twice in
    one term. Here the bytes are fsynced before the rename, the folder after it, and only then
    does pysyncobj send the vote."""

    def __init__(self, path: str, ledger: SyncLedger | None) -> None:
        super().__init__(path)
        self._ledger = ledger

    def storeMeta(self, meta: dict[str, Any]) -> None:
        path = Path(self.getPath())
        staged = path.with_name(path.name + ".tmp")
        with open(staged, "wb") as file:
            file.write(dumps(meta))
            fsync_written(file, self._ledger)
        os.replace(staged, path)
        fsync_files([path.parent])


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


def rewind_journal(path: Path, end: int) -> int:
    """Make the journal at ``path`` end at byte ``end`` (where an entry ends), zeroing the
    entries after it, as a power cut leaves a journal last synced there; its end before. For
    the chaos runner (`tickwheel.chaos.storage.power_cut`)."""
    with open(path, "r+b") as file:
        header = file.read(FIRST_RECORD_OFFSET)
        (before,) = struct.unpack_from("<I", header, LAST_RECORD_OFFSET_OFFSET)
        if before > end >= FIRST_RECORD_OFFSET:
            file.seek(end)
            file.write(bytes(before - end))
            file.seek(LAST_RECORD_OFFSET_OFFSET)
            file.write(struct.pack("<I", end))
    return int(before)


_RECORD_OVERHEAD = 24
"""Bytes of a journal record besides its command: size, index, term, size."""


def _journal_record(command: bytes, idx: int, term: int) -> bytes:
    """One entry as pysyncobj's journal stores it: size, index, term, command, size."""
    data = struct.pack("<QQ", idx, term) + command
    size = struct.pack("<I", len(data))
    return size + data + size


def _close_unsynced(journal_file: ResizableFile) -> None:
    """Close pysyncobj's map of the journal (read at start, then replaced by a `JournalFile`)
    without ``msync``."""
    journal_file._ResizableFile__mm.close()
    journal_file._ResizableFile__f.close()
