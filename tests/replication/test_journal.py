"""The Raft journal (`AtomicJournal`): a process killed at any moment of a compaction leaves
the old journal or the new one, whole, never a journal missing entries it had acknowledged;
and a full disk is an ``OSError`` that changes nothing, never a SIGBUS.

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

from tickwheel.replication.raft.files import AtomicJournal, MsyncJournal

ENTRIES, KEEP_FROM = 40_000, 20_000
_WRITER = """
import sys
from pysyncobj.journal import FileJournal
from tickwheel.replication.raft.files import {cls} as Journal
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
from tickwheel.replication.raft.files import {cls} as Journal
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
