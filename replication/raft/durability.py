"""Making the Raft layer's files durable, and noting what each sync made durable: the
`SyncLedger` a node keeps with ``--sync-ledger`` (testing only), from which the chaos runner's
power cut (`tickwheel.chaos.storage.power_cut`) keeps exactly the synced bytes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO


class SyncLedger:
    """Where a node notes, after each sync, how many bytes of a file it made durable: what the
    chaos runner's power cut keeps of that file (`tickwheel.chaos.storage.power_cut`). One
    small file per synced file, named by its inode number (a rename keeps it), holding the
    length as 20 digits. Written after the sync returns, so it never claims more than the disk
    holds. For testing only (``serve --sync-ledger``)."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder

    def note(self, fd: int, length: int | None = None) -> None:
        """``length`` bytes of the open file ``fd`` (its size when None) are on disk."""
        status = os.fstat(fd)
        entry = os.open(self.folder / str(status.st_ino), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(entry, b"%020d" % (status.st_size if length is None else length), 0)
        finally:
            os.close(entry)

    def read(self) -> dict[int, int]:
        """``{inode: length}`` of every file noted."""
        return {int(entry.name): int(entry.read_bytes() or b"0")
                for entry in self.folder.iterdir()}


def fsync_written(file: BinaryIO, ledger: SyncLedger | None) -> None:
    """Flush and fsync ``file``, open for writing, and note it in ``ledger``."""
    file.flush()
    os.fsync(file.fileno())
    if ledger is not None:
        ledger.note(file.fileno())


def fsync_files(paths: list[Path], ledger: SyncLedger | None = None) -> None:
    """fsync each file (or folder: its entries), noting the files in ``ledger``."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            if ledger is not None and path.is_file():
                ledger.note(fd)
        finally:
            os.close(fd)
