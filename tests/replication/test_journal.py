"""The Raft journal (`AtomicJournal`): a process killed at any moment of a compaction leaves
the old journal or the new one, whole, never a journal missing entries it had acknowledged;
a full disk is an ``OSError`` that changes nothing, never a SIGBUS; and with ``--fsync``
(`MsyncJournal`) a power cut keeps every entry added and the term and vote.

pysyncobj compacts in place: it resets the file's end mark and re-adds every kept entry from
the first byte, so a kill part way left only some of them (the kill test, run against
pysyncobj's `FileJournal`, finds such a journal in most of its kills). It grows its mapped
file with ``ftruncate``, so on a full disk the first write to a new page killed the process
with SIGBUS (the full-disk test, run against it: exit 135 after 250 entries).
"""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pysyncobj.journal import FileJournal

from tickwheel.chaos.storage import power_cut
from tickwheel.replication.raft.durability import SyncLedger
from tickwheel.replication.raft.journal import AtomicJournal, MsyncJournal
from tickwheel.replication.raft.snapshot import SNAPSHOT_FILE, write_snapshot

ENTRIES, KEEP_FROM = 40_000, 20_000
_WRITER = """
import sys
from pysyncobj.journal import FileJournal
from tickwheel.replication.raft.journal import {cls} as Journal
written = FileJournal(sys.argv[1])
for idx in range(1, {entries} + 1):
    written.add(b"c" * 200, idx, 1)
written._destroy()
journal = Journal(sys.argv[1])
print("compacting", flush=True)
journal.deleteEntriesTo({keep_from})
journal.flush()
print("compacted", flush=True)
sys.stdin.read()
"""
_FILLER = """
import errno, sys
from tickwheel.replication.raft.journal import {cls} as Journal
journal = Journal(sys.argv[1])
added = 0
try:
    for idx in range(1, 1_000_000):
        journal.add(b"e" * 4096, idx, 1)
        added = idx
except OSError as error:
    print(added, errno.errorcode[error.errno], flush=True)
journal._destroy()
"""


def entries(path: Path) -> list[int]:
    journal = FileJournal(str(path))
    try:
        return [journal[i][1] for i in range(len(journal))]
    finally:
        journal._destroy()


def test_compaction_keeps_the_tail_and_the_journal_goes_on_from_there(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    journal = AtomicJournal(str(path))
    for idx in range(1, 101):
        journal.add(f"c{idx}".encode(), idx, 1)
    journal.deleteEntriesTo(60)
    journal.add(b"c101", 101, 2)
    assert [journal[i][1] for i in range(len(journal))] == list(range(61, 102))
    journal._destroy()
    reopened = FileJournal(str(path))
    assert [reopened[i] for i in (0, len(reopened) - 1)] == [(b"c61", 61, 1), (b"c101", 101, 2)]
    reopened._destroy()


@pytest.mark.cluster
@pytest.mark.parametrize("journal_class", [AtomicJournal, MsyncJournal])
def test_a_process_killed_while_compacting_leaves_the_old_journal_or_the_new_whole(
        tmp_path: Path, journal_class: type[FileJournal]) -> None:
    rng = random.Random(18)
    old, new = list(range(1, ENTRIES + 1)), list(range(KEEP_FROM + 1, ENTRIES + 1))
    for attempt in range(6):
        path = tmp_path / f"journal-{attempt}"
        writer = subprocess.Popen(
            [sys.executable, "-c", _WRITER.format(cls=journal_class.__name__, entries=ENTRIES,
                                                  keep_from=KEEP_FROM), str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "compacting"
        time.sleep(rng.uniform(0, 0.03))
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(10)
        found = entries(path)
        assert found in (old, new), (attempt, found[:1], found[-1:], len(found))


@pytest.mark.cluster
@pytest.mark.parametrize("journal_class", [AtomicJournal, MsyncJournal])
def test_a_full_disk_refuses_the_entry_and_keeps_every_entry_before_it(
        small_disk: Callable[[str, str], Path], journal_class: type[FileJournal]) -> None:
    disk = small_disk("disk", "1m")
    path = disk / "journal"
    filler = subprocess.run(
        [sys.executable, "-c", _FILLER.format(cls=journal_class.__name__), str(path)],
        capture_output=True, text=True, timeout=60, check=False)
    assert filler.returncode == 0, (filler.returncode, filler.stderr[-2_000:])
    added, code = filler.stdout.split()
    assert code == "ENOSPC" and int(added) > 100
    assert entries(path) == list(range(1, int(added) + 1))

    journal = journal_class(str(path))  # reopened on the full disk: the file is allocated
    with pytest.raises(OSError) as full:
        journal.add(b"e" * 4096, int(added) + 1, 1)
    assert full.value.errno == errno.ENOSPC
    with pytest.raises(OSError):  # no room for the compacted copy: the old journal stays
        journal.deleteEntriesTo(10)
    assert not (disk / "journal.compacting").exists()
    journal._destroy()
    assert entries(path) == list(range(1, int(added) + 1))


def power_cut_folder(tmp_path: Path) -> tuple[Path, Path, SyncLedger]:
    """``(data, journal path, ledger)``: the layout `power_cut` knows."""
    (tmp_path / "data" / "raft").mkdir(parents=True)
    return tmp_path / "data", tmp_path / "data" / "raft" / "journal", SyncLedger(
        tmp_path / "synced")


def test_after_a_power_cut_an_fsync_journal_has_every_entry_it_added_and_its_vote(
        tmp_path: Path) -> None:
    """What ``--fsync`` promises: an entry is on disk before pysyncobj acknowledges it, and
    so are the term and the vote before the vote is sent. pysyncobj renamed its term-and-vote
    file into place unsynced: after the cut it was empty, which reads as term 0 and no vote
    (so a restarted node could vote twice in one term)."""
    data, path, ledger = power_cut_folder(tmp_path)
    journal = MsyncJournal(str(path), ledger=ledger)
    for idx in range(1, 201):
        journal.add(b"c" * 300, idx, 3)
    journal.setCurrentTerm(5, "node-b")
    journal.deleteEntriesTo(50)  # compacted: a new file, synced before its rename
    for idx in range(201, 301):
        journal.add(b"c" * 300, idx, 5)
    AtomicJournal.add(journal, b"unsynced", 301, 5)  # written, the power cut before its msync
    journal._file.close_unsynced()  # the process dies with the power
    cut = power_cut(data, ledger)
    assert cut.journal_end is not None  # the unsynced entry was cut
    reopened = MsyncJournal(str(path), ledger=ledger)
    try:
        assert [reopened[i][1] for i in range(len(reopened))] == list(range(51, 301))
        assert (reopened.getCurrentTerm(), reopened.getVotedForNodeId()) == (5, "node-b")
    finally:
        reopened._destroy()


def test_a_journal_never_synced_is_empty_after_a_power_cut_and_opens_as_a_new_one(
        tmp_path: Path) -> None:
    """Without ``--fsync`` nothing is synced: the power cut leaves the files empty (pysyncobj
    cannot map an empty journal: it raised ``ValueError`` and the node never started)."""
    data, path, ledger = power_cut_folder(tmp_path)
    journal = AtomicJournal(str(path), ledger=ledger)
    for idx in range(1, 11):
        journal.add(b"c" * 300, idx, 1)
    journal._destroy()
    assert power_cut(data, ledger).files == 1
    assert path.stat().st_size == 0
    reopened = AtomicJournal(str(path))
    try:
        assert len(reopened) == 0
        reopened.add(b"c", 1, 1)
    finally:
        reopened._destroy()
    assert entries(path) == [1]


def reopened_entries(path: Path) -> list[tuple[int, int]]:
    """``(index, term)`` of each entry a restarted node reads from the file."""
    journal = FileJournal(str(path))
    try:
        return [(journal[i][1], journal[i][2]) for i in range(len(journal))]
    finally:
        journal._destroy()


@pytest.mark.parametrize("journal_class", [AtomicJournal, MsyncJournal])
def test_entries_a_follower_drops_to_take_them_again_stay_on_disk_until_one_differs(
        tmp_path: Path, journal_class: type[AtomicJournal]) -> None:
    """pysyncobj's follower drops the entries after the leader's prevLogIdx and adds the
    leader's, even when it holds them already (an overlapping batch). With pysyncobj's
    journal, a node that died in between had lost acknowledged entries 6 to 10."""
    path = tmp_path / "journal"
    journal = journal_class(str(path))
    for idx in range(1, 11):
        journal.add(b"c%d" % idx, idx, 1)
    journal.flush()
    journal.deleteEntriesFrom(5)  # an overlapping batch from prevLogIdx 5 arrives
    assert len(journal) == 5
    assert reopened_entries(path) == [(i, 1) for i in range(1, 11)]  # died here: all kept
    for idx in (6, 7):  # the batch holds what the file kept: taken as it is
        journal.add(b"c%d" % idx, idx, 1)
    assert [journal[i][1] for i in range(len(journal))] == list(range(1, 8))
    assert reopened_entries(path) == [(i, 1) for i in range(1, 11)]
    journal.deleteEntriesTo(2)  # a compaction keeps what the file kept, after the list
    assert reopened_entries(path) == [(i, 1) for i in range(3, 11)]
    journal.add(b"new", 8, 2)  # a conflict (another term): the rest of what was kept goes
    journal.flush()
    assert reopened_entries(path) == [*((i, 1) for i in range(3, 8)), (8, 2)]
    journal.add(b"next", 9, 2)
    journal._destroy()
    assert reopened_entries(path) == [*((i, 1) for i in range(3, 8)), (8, 2), (9, 2)]


def test_a_power_cut_while_a_follower_takes_its_entries_again_keeps_them(
        tmp_path: Path) -> None:
    data, path, ledger = power_cut_folder(tmp_path)
    journal = MsyncJournal(str(path), ledger=ledger)
    for idx in range(1, 11):
        journal.add(b"c" * 100, idx, 1)
    journal.deleteEntriesFrom(5)
    journal.add(b"c" * 100, 6, 1)
    journal._file.close_unsynced()
    power_cut(data, ledger)
    assert reopened_entries(path) == [(i, 1) for i in range(1, 11)]


def test_a_compaction_past_the_journals_end_cuts_nothing(tmp_path: Path) -> None:
    """Compaction keeps the snapshot's last two entries; a cut past the journal's end is a cut
    to a snapshot a received one replaced: cutting emptied the journal, and the node died
    later, with an IndexError far from its cause (chaos run of stop 33). Nothing is cut; a
    later cut within the journal cuts."""
    journal = AtomicJournal(str(tmp_path / "journal"))
    for idx in (149_920, 149_921):
        journal.add(b"c" * 10, idx, 9)
    journal.deleteEntriesTo(835)
    assert [entry[1] for entry in journal] == [149_920, 149_921]
    journal.deleteEntriesTo(1)
    assert [entry[1] for entry in journal] == [149_921]
    journal._destroy()


def test_a_cut_to_a_snapshot_while_the_follower_takes_entries_again_waits_for_the_next(
        tmp_path: Path) -> None:
    """pysyncobj cuts the journal to its snapshot at the tick after it took it. A follower
    that meanwhile took the leader's entries again from an earlier index (the leader's
    batches come one message at a time under load) had a journal ending before that index:
    the node died on ``compacting to entry 125 of 100 would empty the journal``. The cut
    now waits for the next snapshot, and no entry is lost, in memory or in the file."""
    path = tmp_path / "journal"
    journal = AtomicJournal(str(path))
    for idx in range(1, 201):
        journal.add(b"c%d" % idx, idx, 1)
    # the snapshot is taken at entry 126 (the cut keeps it: entry 125 of the list) ...
    journal.deleteEntriesFrom(100)  # ... then the leader's batch from entry 101 arrives
    journal.deleteEntriesTo(125)  # the cut, at the next tick, before the next batch
    assert [entry[1] for entry in journal] == list(range(1, 101))
    for idx in range(101, 201):  # the leader's next batches: the same entries
        journal.add(b"c%d" % idx, idx, 1)
    journal.deleteEntriesTo(150)  # the next snapshot's cut
    assert [entry[1] for entry in journal] == list(range(151, 201))
    journal._destroy()
    assert reopened_entries(path) == [(i, 1) for i in range(151, 201)]


def test_a_journal_killed_before_its_cut_to_the_snapshot_begins_where_the_snapshot_ends(
        tmp_path: Path) -> None:
    """pysyncobj renames a snapshot into place, then cuts the journal at its next tick; opened
    after a kill in between, the journal is cut as that tick would have cut it, the entries
    after the snapshot kept (pysyncobj itself replaced it with the snapshot's two entries)."""
    path = tmp_path / "journal"
    written = MsyncJournal(str(path))
    for idx in range(1, 23):
        written.add(b"c%d" % idx, idx, 1)
    write_snapshot(str(tmp_path / SNAPSHOT_FILE), ("manifest",),
                   (written[19], written[18], set()), fsync=True)
    written._destroy()
    reopened = MsyncJournal(str(path))
    assert [entry[1] for entry in reopened] == list(range(19, 23))
    assert reopened[3] == (b"c22", 22, 1)
    reopened._destroy()
    assert entries(path) == list(range(19, 23))  # on disk too, not only in the list


@pytest.mark.parametrize("tail", ["another term", "beyond the journal", "damaged"])
def test_a_journal_that_does_not_hold_the_snapshots_entries_is_left_as_it_is(
        tmp_path: Path, tail: str) -> None:
    """Only the snapshot's own entries, same index and term, mark where to cut; anything else
    is pysyncobj's to decide (a snapshot from the leader replaces the log)."""
    path, snapshot = tmp_path / "journal", tmp_path / SNAPSHOT_FILE
    written = AtomicJournal(str(path))
    for idx in range(1, 11):
        written.add(b"c%d" % idx, idx, 1)
    if tail == "damaged":
        snapshot.write_bytes(b"not a snapshot")
    else:
        last, before = ((b"c8", 8, 2), (b"c7", 7, 2)) if tail == "another term" else (
            (b"c31", 31, 1), (b"c30", 30, 1))
        write_snapshot(str(snapshot), ("manifest",), (last, before, set()), fsync=False)
    written._destroy()
    reopened = AtomicJournal(str(path))
    assert [entry[1] for entry in reopened] == list(range(1, 11))
    reopened._destroy()
