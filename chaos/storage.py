"""Damage to a stopped node's files, as an operator's bad day brings it.

Each function damages the data folder of a node that is not running and says what it did.
Damage a node repairs by itself: flipped bytes in hour logs and index units (mended from the
peers' copies), a cut tail of an hour's files (its snapshot's lengths fetch it back). Damage it
must refuse: a flipped byte in its Raft snapshot (it exits 3; the runner then applies the
remedy the node names, moving the folder away). A power cut: a node started with ``--fsync``
keeps what it synced and nothing more. And a disk that fills up under a running node.
"""

from __future__ import annotations

import os
import random
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tickwheel.node import free_bytes
from tickwheel.replication.raft import (
    JOURNAL_FILE,
    SnapshotDamaged,
    SyncLedger,
    read_snapshot,
    rewind_journal,
)
from tickwheel.wheel import faults

RECENT_UNITS = 400
"""``rot`` damages records among this many of an hour's latest."""
BALLAST = "ballast"
"""The file a full disk is made of, in the node's data folder."""


def _hours(data: Path) -> list[Path]:
    return faults.hour_folders(data / "state" / "wheel")


def _weighted(hours: list[Path], rng: random.Random) -> Path:
    """An hour, drawn by its number of messages (most hours of a run hold one or two)."""
    return rng.choices(hours, weights=[(h / faults.INDEX).stat().st_size for h in hours])[0]


def _covered(data: Path) -> dict[str, int]:
    """``{state file: length}`` the node's snapshot lists (empty without a readable one):
    bytes past those lengths are cut back at start and written again from the journal, which
    would hide damage there."""
    try:
        (_, _, files, *_), _ = read_snapshot(str(data / "raft" / "snapshot"))
    except (OSError, SnapshotDamaged):
        return {}
    return dict(files)


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        byte = file.read(1)[0]
        file.seek(offset)
        file.write(bytes([byte ^ 0x10]))


def rot(data: Path, rng: random.Random, records: int = 3) -> str:
    """Flip a byte inside ``records`` records of one hour's log and inside one of its index
    units, within what the snapshot lists when it lists that hour. A record is read (and
    mended) only when a leader hands its message out, so records of messages already delivered
    would test nothing."""
    covered = _covered(data)
    hours = _hours(data)
    if not hours:
        return "no hour files yet: nothing damaged"
    hour = _weighted(hours, rng)
    name = f"wheel/hours/{hour.name}"
    index = (hour / faults.INDEX).read_bytes()
    units = faults.units(min(len(index), covered.get(f"{name}/index", len(index))))
    log_end = covered.get(f"{name}/log", (hour / faults.LOG).stat().st_size)
    damaged = []
    # of the latest filed (not the last: damage there reads as a torn write), most likely
    # still pending, so read again when handed out
    recent = range(max(0, units - 1 - RECENT_UNITS), units - 1)
    for unit in rng.sample(recent, min(records, len(recent))):
        payload = faults.payload_span(index, unit)
        if payload.stop <= log_end:
            flip(hour / faults.LOG, rng.randrange(payload.start, payload.stop))
            damaged.append(unit)
    unit = rng.randrange(units - 1)
    span = faults.unit_span(unit)
    flip(hour / faults.INDEX, rng.randrange(span.start, span.stop))
    return (f"flipped a byte in records {damaged} and index unit {unit} of hour "
            f"{hour.name}{'' if covered else ' (no snapshot yet: replayed from the journal)'}")


def cut(data: Path, rng: random.Random) -> str:
    """Cut the tail of one hour's log and index (as a lost write would)."""
    hours = _hours(data)
    if not hours:
        return "no hour files yet: nothing cut"
    hour = _weighted(hours, rng)
    sizes = {}
    for name in (faults.LOG, faults.INDEX):
        path = hour / name
        size = path.stat().st_size
        sizes[name] = (size, rng.randrange(size // 2, size))
        os.truncate(path, sizes[name][1])
    return f"cut hour {hour.name}: " + ", ".join(
        f"{name} {before} -> {after} bytes" for name, (before, after) in sizes.items())


def rot_snapshot(data: Path, rng: random.Random) -> str:
    """Flip one byte of the Raft snapshot, if there is one."""
    snapshot = data / "raft" / "snapshot"
    if not snapshot.exists():
        return "no snapshot yet: nothing damaged"
    offset = rng.randrange(snapshot.stat().st_size)
    flip(snapshot, offset)
    return f"flipped the byte at {offset} of the Raft snapshot"


POWERED = ("raft", "state")
"""The folders of a node's data whose durability is the node's job (its delivery journal beside
them is the runner's record of what it did, not state)."""


@dataclass(frozen=True, slots=True)
class PowerCut:
    """What `power_cut` dropped: the files cut and their bytes, and the journal's end."""

    files: int
    bytes: int
    journal_end: tuple[int, int] | None
    """``(before, after)``, when the journal lost entries."""

    def __str__(self) -> str:
        journal = ("the journal untouched" if self.journal_end is None
                   else "the journal cut from byte {} to {}".format(*self.journal_end))
        return f"{self.files} files lost {self.bytes} unsynced bytes, {journal}"


def power_cut(data: Path, ledger: SyncLedger) -> PowerCut:
    """What a power cut leaves of the data of a node killed at that moment (SIGKILL: the
    kernel still held all it wrote): each file keeps the bytes the node's last sync of it made
    durable, as its `SyncLedger` noted them, and loses the rest; a file never synced is left
    empty, as a file system that journals only its metadata may leave it; the Raft journal
    ends where its last sync ended. Modelled at file level: renames and deletions count as
    durable, and bytes overwritten in place are not put back."""
    synced = ledger.read()
    files = lost = 0
    journal_end = None
    for folder in POWERED:
        for path in sorted(p for p in (data / folder).rglob("*") if p.is_file()):
            status = path.stat()
            keep = synced.get(status.st_ino, 0)
            if path == data / "raft" / JOURNAL_FILE and keep:
                end = rewind_journal(path, keep)
                if end > keep:
                    journal_end = (end, keep)
            elif status.st_size > keep:
                os.truncate(path, keep)
                files += 1
                lost += status.st_size - keep
    return PowerCut(files, lost, journal_end)


def fill(data: Path, leave_bytes: int) -> str:
    """Leave about ``leave_bytes`` free on the disk holding ``data`` (a ballast file)."""
    ballast = data / BALLAST
    ballast.unlink(missing_ok=True)
    size = max(0, free_bytes(data) - leave_bytes)
    with open(ballast, "wb") as file:
        os.posix_fallocate(file.fileno(), 0, max(1, size))
    return f"filled the disk with {size} bytes, {leave_bytes} left free"


def empty(data: Path) -> None:
    (data / BALLAST).unlink(missing_ok=True)


class MountFailed(OSError):
    """A small disk could not be mounted (mounting a tmpfs needs root)."""


def mount_disk(folder: Path, size: str) -> None:
    """Mount a tmpfs of ``size`` (``"512m"``) at ``folder`` (created): a disk of its own that
    really fills up. `MountFailed` says why not."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise MountFailed(f"mounting a tmpfs at {folder} failed: {done.stderr.strip()}")


def unmount_disk(folder: Path) -> None:
    """Unmount what `mount_disk` mounted (lazily: a file may still be open)."""
    subprocess.run(["umount", "--lazy", str(folder)], check=False)
