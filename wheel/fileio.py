"""The files of an hour segment and the few ways they are read and written."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

LOG, INDEX, HEADS, TOMBSTONES = "log", "index", "heads", "tombstones"
APPEND_ONLY_FILES = (LOG, INDEX, TOMBSTONES)
"""The files of a segment that only ever grow; heads is rewritten in place."""
FDS_PER_HOUR = 4
"""Write descriptors an open segment may hold, one per file."""


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def read_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def pread_file(path: Path, size: int, offset: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | bytearray) -> None:
    """Append all of ``data``."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def overwrite(fd: int, data: bytes) -> None:
    """Make the file hold exactly ``data``, written in place from offset 0."""
    view, written = memoryview(data), 0
    while written < len(data):
        written += os.pwrite(fd, view[written:], written)
    os.ftruncate(fd, len(data))


def map_readonly(path: Path, size: int) -> mmap.mmap | None:
    if size == 0:
        return None
    with open(path, "rb") as file:
        return mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ)


class SegmentFiles:
    """What an open segment holds of the operating system: a write descriptor per file, kept
    open while the segment is (at most ``FDS_PER_HOUR``), and read-only maps of log and index
    for the hours the dispatcher walks."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._write_fds: dict[str, int] = {}
        self.mapped = False
        self.log_map: mmap.mmap | None = None
        self.index_map: mmap.mmap | None = None

    def write_fd(self, name: str) -> int:
        """The descriptor of file ``name``: append-only but for heads, which is rewritten in
        place at offset 0 and never changes size."""
        fd = self._write_fds.get(name)
        if fd is None:
            flags = os.O_WRONLY | os.O_CREAT | (0 if name == HEADS else os.O_APPEND)
            fd = self._write_fds[name] = os.open(self.path / name, flags, 0o644)
        return fd

    def map(self, log_bytes: int, index_bytes: int) -> None:
        """Map the first ``log_bytes`` of the log and ``index_bytes`` of the index (again)."""
        self.unmap()
        self.mapped = True
        self.log_map = map_readonly(self.path / LOG, log_bytes)
        self.index_map = map_readonly(self.path / INDEX, index_bytes)

    def unmap(self) -> None:
        for view in (self.log_map, self.index_map):
            if view is not None:
                view.close()
        self.log_map = self.index_map = None
        self.mapped = False

    def close(self) -> None:
        self.unmap()
        for fd in self._write_fds.values():
            os.close(fd)
        self._write_fds.clear()
