"""The wheel's ``LOCK`` (one process at a time) and ``meta`` (the cursor and the stamp).

``meta`` holds two copies, each with a sequence number and a CRC (`tickwheel.wheel.format`);
a write overwrites the older copy with one ``pwrite``, so a torn write leaves the other intact.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import ExitStack
from pathlib import Path

from tickwheel.common.errors import StorageLocked
from tickwheel.wheel.format import META, META_COPIES, pack_meta, unpack_meta
from tickwheel.wheel.types import Cursor

_META = "meta"
_LOCK = "LOCK"


class MetaFile:
    """The lock held and the meta file open for the wheel's lifetime."""

    def __init__(self, lock_fd: int, meta_fd: int, sequence: int) -> None:
        self._lock_fd = lock_fd
        self._meta_fd = meta_fd
        self._sequence = sequence

    @classmethod
    def open(cls, root: Path) -> tuple[MetaFile, Cursor, int]:
        """Lock ``root`` and read its meta: ``(file, cursor, stamp_ms)`` (zeros when new).
        Raises `StorageLocked` if another process holds it."""
        with ExitStack() as on_failure:
            lock_fd = os.open(root / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
            on_failure.callback(os.close, lock_fd)
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StorageLocked(str(root)) from None
            meta_fd = os.open(root / _META, os.O_RDWR | os.O_CREAT, 0o644)
            on_failure.callback(os.close, meta_fd)
            meta = unpack_meta(os.pread(meta_fd, META_COPIES * META.size, 0), str(root / _META))
            sequence, second, local_index, stamp_ms = meta or (0, 0, 0, 0)
            on_failure.pop_all()
        return cls(lock_fd, meta_fd, sequence), Cursor(second, local_index), stamp_ms

    @property
    def closed(self) -> bool:
        return self._lock_fd < 0

    def write(self, cursor: Cursor, stamp_ms: int) -> None:
        """Overwrite the older of the two copies: one ``pwrite``, no rename."""
        self._sequence += 1
        os.pwrite(self._meta_fd, pack_meta(self._sequence, *cursor, stamp_ms),
                  self._sequence % META_COPIES * META.size)

    def close(self) -> None:
        """Release the lock and the file."""
        os.close(self._meta_fd)
        os.close(self._lock_fd)
        self._lock_fd = -1
