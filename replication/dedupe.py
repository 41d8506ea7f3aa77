"""The replicated dedupe window: a retried schedule gets its original result back.

Every scheduled id is remembered (by its 128-bit `dedupe_key`) with the handle and due time it
got, for ``window_ms`` of *stamp* time (the leader's clock carried by the commands, so every
replica forgets the same ids at the same command) and for at most ``max_ids`` ids.

Ids live in buckets of ``window_ms / 10`` of stamp time. A bucket is a dict in memory and an
append-only file on disk (``<bucket>``: 40-byte CRC'd entries); forgetting a bucket drops the
dict at once, while its file stays until a snapshot no longer names it (`forgotten_files`).
Memory is about 150 bytes per remembered id (`tests/replication/memory_terms_bench.py`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import zlib
from itertools import repeat
from pathlib import Path
from typing import Final

from tickwheel.replication.commands import DEDUPE_KEY_BYTES

log = logging.getLogger("tickwheel.replication.dedupe")

BUCKETS_PER_WINDOW: Final = 10
# dedupe key (16 bytes), handle i64, deliver_at_ms i64
_ENTRY_HEAD: Final = struct.Struct(f"<{DEDUPE_KEY_BYTES}sqq")
# crc32 of the head u32, pad u32
_ENTRY_TAIL: Final = struct.Struct("<II")
_ENTRY: Final = struct.Struct(_ENTRY_HEAD.format + _ENTRY_TAIL.format[1:])  # one unpack for both
_CRC_SPAN: Final = _ENTRY_HEAD.size
_MAX_BUFFERED_BYTES: Final = 1 << 20
_HANDLE_MASK: Final = (1 << 64) - 1


class DedupeWindow:
    """Single-threaded, like the wheel it sits beside. Open with `DedupeWindow.open`."""

    def __init__(self, root: Path, window_ms: int, max_ids: int) -> None:
        self._root = root
        self._bucket_ms = max(1, window_ms // BUCKETS_PER_WINDOW)
        self._max_ids = max_ids
        # key -> deliver_at_ms << 64 | handle: one int per id keeps the window small
        self._buckets: dict[int, dict[bytes, int]] = {}
        self._ids = 0
        self._unwritten: dict[int, bytearray] = {}
        self._forgotten: list[int] = []

    @classmethod
    def open(cls, root: Path, window_ms: int, max_ids: int) -> DedupeWindow:
        """Load the bucket files under ``root``; a torn or damaged tail is cut off."""
        root.mkdir(parents=True, exist_ok=True)
        window = cls(root, window_ms, max_ids)
        for name in sorted(os.listdir(root)):
            if name.isdigit():
                window._load(int(name))
        return window

    @property
    def ids(self) -> int:
        return self._ids

    def remembered(self, keys: set[bytes]) -> dict[bytes, tuple[int, int]]:
        """``{key: (handle, deliver_at_ms)}`` first returned, for those of ``keys`` still
        remembered: a C-level set intersection per bucket, not a lookup per key and bucket."""
        found: dict[bytes, tuple[int, int]] = {}
        for bucket in self._buckets.values():
            for key in bucket.keys() & keys:
                value = bucket[key]
                found[key] = value & _HANDLE_MASK, value >> 64
        return found

    def remembered_any(self, keys: list[bytes]) -> dict[bytes, tuple[int, int]]:
        """`remembered`, for a thread other than the one that adds: a copy of the buckets,
        then one ``get`` per key and bucket (each atomic), never an iteration over a dict
        another thread changes."""
        found: dict[bytes, tuple[int, int]] = {}
        for bucket in list(self._buckets.values()):
            for key in keys:
                value = bucket.get(key)
                if value is not None:
                    found[key] = value & _HANDLE_MASK, value >> 64
        return found

    def add_many(self, keys: list[bytes], handles: list[int], deliver_at_ms: list[int],
                 stamp_ms: int) -> None:
        """Remember each key with its handle and due time, stamped ``stamp_ms``."""
        number = stamp_ms // self._bucket_ms
        bucket = self._buckets.get(number)
        if bucket is None:
            bucket = self._buckets[number] = {}
        bucket.update(zip(keys, [due_ms << 64 | handle for handle, due_ms
                                 in zip(handles, deliver_at_ms, strict=True)], strict=True))
        crcs = map(zlib.crc32, map(_ENTRY_HEAD.pack, keys, handles, deliver_at_ms))
        unwritten = self._unwritten.setdefault(number, bytearray())
        unwritten += b"".join(map(_ENTRY.pack, keys, handles, deliver_at_ms, crcs, repeat(0)))
        self._ids += len(keys)
        if len(unwritten) >= _MAX_BUFFERED_BYTES:
            self._flush_bucket(number)

    def forget_expired(self, stamp_ms: int) -> None:
        """Forget the buckets older than the window, then the oldest beyond ``max_ids``."""
        oldest_kept = stamp_ms // self._bucket_ms - BUCKETS_PER_WINDOW
        for number in sorted(self._buckets):
            over = self._ids > self._max_ids and len(self._buckets) > 1
            if number >= oldest_kept and not over:
                break
            self._forget(number, "window" if number < oldest_kept else "max_ids")

    def files(self) -> dict[str, int]:
        """Flush, then the remembered buckets' files with their sizes."""
        for number in list(self._unwritten):
            self._flush_bucket(number)
        return {path.name: path.stat().st_size for number in sorted(self._buckets)
                if (path := self._path(number)).exists()}

    def forgotten_files(self) -> list[str]:
        """Files of forgotten buckets still on disk; the caller deletes them when no
        snapshot names them any more (`delete_file`)."""
        return [self._path(number).name for number in self._forgotten]

    def delete_file(self, name: str) -> None:
        (self._root / name).unlink(missing_ok=True)
        with contextlib.suppress(ValueError):
            self._forgotten.remove(int(name))

    def flush(self) -> None:
        """Write the buckets' buffered ids to their files."""
        for number in list(self._unwritten):
            self._flush_bucket(number)

    def close(self) -> None:
        self.flush()

    def _path(self, number: int) -> Path:
        return self._root / f"{number:012d}"

    def _forget(self, number: int, reason: str) -> None:
        dropped = self._buckets.pop(number)
        self._ids -= len(dropped)
        self._unwritten.pop(number, None)
        self._forgotten.append(number)
        log.debug("event=dedupe_bucket_forgotten bucket=%d ids=%d reason=%s", number,
                  len(dropped), reason)

    def _flush_bucket(self, number: int) -> None:
        unwritten = self._unwritten.pop(number)
        fd = os.open(self._path(number), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                     0o644)
        try:
            view = memoryview(unwritten)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)

    def _load(self, number: int) -> None:
        path = self._path(number)
        data = path.read_bytes()
        bucket: dict[bytes, int] = {}
        good = 0
        for pos in range(0, len(data) - _ENTRY.size + 1, _ENTRY.size):
            key, handle, deliver_at_ms, crc, _ = _ENTRY.unpack_from(data, pos)
            if zlib.crc32(data[pos:pos + _CRC_SPAN]) != crc:
                break
            bucket[key] = deliver_at_ms << 64 | handle
            good = pos + _ENTRY.size
        if good != len(data):
            log.warning("event=dedupe_tail_cut file=%s kept_bytes=%d of=%d", path, good,
                        len(data))
            os.truncate(path, good)
        self._buckets[number] = bucket
        self._ids += len(bucket)
