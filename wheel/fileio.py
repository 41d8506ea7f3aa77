"""The files of an hour segment and the few ways they are read and written."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

LOG, INDEX, HEADS, TOMBSTONES = "log", "index", "heads", "tombstones"
APPEND_ONLY_FILES = (LOG, INDEX, TOMBSTONES)
"""The files of a segment that only ever grow; heads is rewritten in place."""


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
