"""One hour of the wheel: its four files (see `tickwheel.wheel.format`) and their state in memory.

Writes are appended to in-memory buffers and reach the files at `HourSegment.flush`, in the
order log, index, tombstones, heads, so that after a crash at any byte the files hold a prefix of
the appends that `HourSegment.open` can repair. Reads of the hour being dispatched go through
read-only memory maps (seed 003 maps the next two hours); reads elsewhere use ``pread``.
"""

from __future__ import annotations

import contextlib
import mmap
import zlib
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path

from tickwheel.common.errors import CorruptSegment, InvariantViolation, invariant
from tickwheel.wheel.fileio import (
    APPEND_ONLY_FILES,
    HEADS,
    INDEX,
    LOG,
    TOMBSTONES,
    SegmentFiles,
    file_size,
    overwrite,
    pread_file,
    write_all,
)
from tickwheel.wheel.format import (
    TOMBSTONE,
    UNIT,
    UNIT_AND_CRC,
    UNIT_CRC,
    UNIT_SIZE,
    RecordFields,
    decode_record,
    pack_heads,
    pack_tombstone,
)
from tickwheel.wheel.mending import Mender, Unmended
from tickwheel.wheel.repair import (
    checked_unit,
    decodes,
    heads_table,
    mended_unit,
    occupancy,
    open_hour,
)


class HourSegment:
    """The files of one hour and the 3,600 chain heads that find every message in them.

    ``heads`` is an ``array('i')`` of (chain head, count) pairs, one pair per second of the
    hour: ``heads[2 * s]`` is the global index of the newest message filed under second ``s``
    (-1 if none), ``heads[2 * s + 1]`` how many there are. ``occupied`` has bit ``s`` set when
    second ``s`` holds a message, so the next non-empty second is found without looking at
    empty ones. ``cancelled[s]`` counts the tombstones of second ``s``' messages (read from
    their units when the segment opens, then kept as tombstones are added): what
    `tickwheel.wheel.due` subtracts from the heads' counts.
    """

    def __init__(self, path: Path, hour: int, heads: array[int], units: int, log_size_bytes: int,
                 tombstones: set[int], mender: Mender) -> None:
        self.path = path
        self._mender = mender
        self.hour = hour
        self.heads = heads
        self.units = units
        self.log_size_bytes = log_size_bytes
        self.tombstones = tombstones
        self.occupied = occupancy(heads)
        self.cancelled = array("i", bytes(4 * len(heads) // 2))
        self._flushed_units = units
        self._flushed_log_size_bytes = log_size_bytes
        self._unflushed_log = bytearray()
        self._unflushed_index = bytearray()
        self._unflushed_tombstones = bytearray()
        self.tombstones_size_bytes = file_size(path / TOMBSTONES)
        """The tombstones file's length, with what is buffered for it (`sizes`)."""
        self._heads_dirty = False
        self._files = SegmentFiles(path)
        self._flushes = 0
        """Odd while a flush moves units from the buffer to the file (`units_and_tombstones`)."""
        self.repaired = False
        """Whether opening it repaired its files (what a crash tore is gone)."""

    # -- opening and repair ---------------------------------------------------------------

    @classmethod
    def open(cls, root: Path, hour: int, mender: Mender) -> HourSegment:
        """Open (creating if absent) the segment of ``hour`` under ``root``, repairing torn
        tails (`tickwheel.wheel.repair`) and writing repaired heads back."""
        path = _segment_path(root, hour)
        opened = open_hour(path, hour, mender)
        segment = cls(path, hour, opened.heads, opened.units, opened.log_size, opened.tombstones,
                      mender)
        if opened.repaired:
            segment.repaired = True
            segment._heads_dirty = True
            segment.flush()
        for global_index in segment.tombstones:
            segment.cancelled[segment.read_unit(global_index)[6]] += 1
        return segment

    # -- writing ----------------------------------------------------------------------------

    def append_many(self, records: Sequence[bytes], deliver_at_ms: Sequence[int],
                    seconds_of_hour: Sequence[int], tags: Sequence[int]
                    ) -> tuple[int, list[int]]:
        """Append messages, each filed under its ``second_of_hour``; returns the global index
        of the first (the rest follow it one by one) and each message's local index. O(1) a
        message: one unit pointing at the old chain head, then the head moves.

        One loop over the batch, not a call per message: every replica files every message,
        and the two calls a message (append, `pack_unit`) were a fifth of a follower's apply."""
        heads = self.heads
        first_global_index = global_index = self.units
        offset = self.log_size_bytes
        occupied = self.occupied
        index = self._unflushed_index
        pack, pack_crc, crc32 = UNIT.pack, UNIT_CRC.pack, zlib.crc32
        local_indexes: list[int] = []
        add_local = local_indexes.append
        for record, due_ms, second, tag in zip(records, deliver_at_ms, seconds_of_hour, tags,
                                               strict=True):
            slot = second << 1
            local_index = heads[slot + 1]
            size = len(record)
            body = pack(offset, size, local_index, global_index, heads[slot], due_ms, second,
                        tag)
            index += body
            index += pack_crc(crc32(body))
            heads[slot] = global_index
            heads[slot + 1] = local_index + 1
            if not local_index:
                occupied |= 1 << second
            add_local(local_index)
            offset += size
            global_index += 1
        self._unflushed_log += b"".join(records)
        self.occupied = occupied
        self.units = global_index
        self.log_size_bytes = offset
        self._heads_dirty = True
        return first_global_index, local_indexes

    def add_tombstone(self, global_index: int, second_of_hour: int) -> None:
        """Cancel the unit ``global_index``, filed under ``second_of_hour``."""
        invariant(global_index < self.units, f"tombstone for unit {global_index} of {self.units}")
        self.tombstones.add(global_index)
        self.cancelled[second_of_hour] += 1
        self._unflushed_tombstones += pack_tombstone(self.hour, global_index)
        self.tombstones_size_bytes += TOMBSTONE.size

    @property
    def buffered_bytes(self) -> int:
        return (len(self._unflushed_log) + len(self._unflushed_index)
                + len(self._unflushed_tombstones))

    def sizes(self) -> dict[str, int]:
        """The append-only files' lengths once what is buffered is written (`segment_files`
        as a flush would leave them, read from memory), those that are not empty."""
        sizes = {LOG: self.log_size_bytes, INDEX: self.units * UNIT_SIZE,
                 TOMBSTONES: self.tombstones_size_bytes}
        return {name: size for name, size in sizes.items() if size}

    def flush(self) -> None:
        """Write what is buffered: log, index, tombstones, then the heads checkpoint."""
        self._flushes += 1
        try:
            self._flush()
        finally:
            self._flushes += 1

    def _flush(self) -> None:
        if self._unflushed_log:
            write_all(self._files.write_fd(LOG), self._unflushed_log)
            self._unflushed_log = bytearray()
        if self._unflushed_index:
            write_all(self._files.write_fd(INDEX), self._unflushed_index)
            self._unflushed_index = bytearray()
        if self._unflushed_tombstones:
            write_all(self._files.write_fd(TOMBSTONES), self._unflushed_tombstones)
            self._unflushed_tombstones = bytearray()
        self._flushed_units = self.units
        self._flushed_log_size_bytes = self.log_size_bytes
        if self._heads_dirty:
            table = heads_table(self.heads)
            overwrite(self._files.write_fd(HEADS),
                      pack_heads(table, self.units, self.log_size_bytes))
            self._heads_dirty = False

    # -- reading ----------------------------------------------------------------------------

    def units_and_tombstones(self) -> tuple[bytes, set[int]]:
        """Every unit of the hour (its bytes, flushed and buffered) and its tombstones, as one
        moment holds them (any thread: a flush meanwhile makes it read again; a unit appended
        meanwhile may be cut short, and the caller drops a partial unit)."""
        while True:
            flushes = self._flushes
            flushed_units = self._flushed_units
            buffered = bytes(self._unflushed_index)
            tombstones = self.tombstones.copy()
            if flushes == self._flushes and not flushes & 1:
                break
        if not flushed_units:
            return buffered, tombstones
        return pread_file(self.path / INDEX, flushed_units * UNIT_SIZE, 0) + buffered, tombstones

    def map_for_reading(self) -> None:
        """Map log and index read-only, for the hours the dispatcher is walking; the maps follow
        the files as flushes extend them."""
        self._files.map(self._flushed_log_size_bytes, self._flushed_units * UNIT_SIZE)

    def unmap(self) -> None:
        self._files.unmap()

    def read_unit(self, global_index: int) -> tuple[int, ...]:
        """``(offset, size, local_index, global_index, pre_global_index, deliver_at_ms,
        second_of_hour, tag)`` of a unit; raises `CorruptSegment` if it fails its CRC."""
        if not 0 <= global_index < self.units:  # the message is formatted only on failure
            invariant(False, f"unit {global_index} of {self.units}")
        pos = global_index * UNIT_SIZE
        data: bytes | bytearray | mmap.mmap
        if global_index >= self._flushed_units:
            data, pos = self._unflushed_index, pos - self._flushed_units * UNIT_SIZE
        elif self._files.mapped:
            data = self._mapped_index(pos + UNIT_SIZE)
        else:
            data, pos = pread_file(self.path / INDEX, UNIT_SIZE, pos), 0
        try:
            return checked_unit(data, pos, global_index, self.path)
        except CorruptSegment as damage:
            return self._mend_unit(global_index, damage)

    def record(self, offset: int, size: int) -> RecordFields:
        """The fields of the log record at ``offset`` (`decode_record`), mended from a copy if
        it fails its CRC; `Unmended` if no copy could replace it."""
        try:
            return decode_record(self.read_record(offset, size))
        except CorruptSegment as damage:
            if offset + size > self._flushed_log_size_bytes:
                raise Unmended(damage.where, str(damage), everywhere=True) from damage
            copy = self._mender.mend(self.path / LOG, offset, size, decodes, damage)
            return decode_record(copy)

    def _mend_unit(self, global_index: int, damage: CorruptSegment) -> tuple[int, ...]:
        """Unit ``global_index``, which failed its check, from a good copy."""
        if global_index >= self._flushed_units:
            raise Unmended(damage.where, str(damage), everywhere=True) from damage
        return mended_unit(self._mender, self.path, global_index, damage)

    def read_record(self, offset: int, size: int) -> bytes:
        """The raw log record at ``offset``; `decode_record` checks its CRC (`record` does
        both, and mends)."""
        if offset >= self._flushed_log_size_bytes:
            start = offset - self._flushed_log_size_bytes
            return bytes(self._unflushed_log[start:start + size])
        if not self._files.mapped:
            return pread_file(self.path / LOG, size, offset)
        if self._files.log_map is None or offset + size > len(self._files.log_map):
            self.map_for_reading()
        log_map = self._files.log_map
        if log_map is None:
            raise InvariantViolation(f"{self.path} log not mapped")
        return log_map[offset:offset + size]

    def _mapped_index(self, end: int) -> mmap.mmap:
        """The index map, remapped if it does not reach ``end`` bytes."""
        if self._files.index_map is None or end > len(self._files.index_map):
            self.map_for_reading()
        index_map = self._files.index_map
        if index_map is None:
            raise InvariantViolation(f"{self.path} index not mapped")
        return index_map

    def units_between(self, first_second: int, last_second: int) -> int:
        """How many messages are filed under seconds ``first_second..last_second`` of the hour."""
        return sum(self.heads[(first_second << 1) + 1:(last_second << 1) + 2:2])

    def scan(self) -> Iterator[tuple[int, ...]]:
        """Every unit of the hour in index order (the same fields as `read_unit`): one
        sequential read instead of a chain walk per second, for loading most of an hour."""
        self._map_flushed_index()
        global_index = 0
        for data in (self._files.index_map or b"", self._unflushed_index):
            view = memoryview(data)
            for pos in range(0, len(view), UNIT_SIZE):
                try:
                    yield checked_unit(view, pos, global_index, self.path)
                except CorruptSegment as damage:
                    yield self._mend_unit(global_index, damage)
                global_index += 1

    def walk_chain(self, global_index: int, stop_local_index: int, max_units: int,
                   global_indexes: array[int], tags: array[int]) -> int:
        """Walk a chain from unit ``global_index`` down (newest first) to local index
        ``stop_local_index``, appending each unit's global index and tag, for at most
        ``max_units`` units; returns the unit to go on from, or -1 when the walk is done.
        `chain` in one loop, for the cursor, which reads every unit it passes on every
        replica (a second of 20,000 messages took 17 ms through `chain`). `CorruptSegment`
        if a unit fails its CRC or does not point to an older one."""
        invariant(global_index < self.units, f"chain walk from unit {global_index} of "
                  f"{self.units}")
        self._map_flushed_index()
        index_map = self._files.index_map
        mapped: bytes | mmap.mmap = index_map if index_map is not None else b""
        unflushed: bytearray = self._unflushed_index
        flushed = self._flushed_units
        data: bytes | bytearray | mmap.mmap
        unpack, crc32, body_size = UNIT_AND_CRC.unpack_from, zlib.crc32, UNIT.size
        add_global, add_tag = global_indexes.append, tags.append
        while global_index >= 0 and max_units > 0:
            if global_index >= flushed:
                data, pos = unflushed, (global_index - flushed) * UNIT_SIZE
            else:
                data, pos = mapped, global_index * UNIT_SIZE
            fields = unpack(data, pos)
            if fields[3] != global_index or crc32(data[pos:pos + body_size]) != fields[8]:
                fields = self._mend_unit(global_index, CorruptSegment(
                    str(self.path / INDEX), f"unit {global_index} is damaged"))
            if fields[4] >= global_index:
                raise CorruptSegment(str(self.path / INDEX), f"unit {global_index} does not "
                                     "point to an older one")
            if fields[2] < stop_local_index:
                return -1
            add_global(global_index)
            add_tag(fields[7])
            global_index = fields[4]
            max_units -= 1
        return global_index

    def _map_flushed_index(self) -> None:
        """Map (again) unless the index map covers every flushed unit."""
        files = self._files
        if not files.mapped or len(files.index_map or b"") < self._flushed_units * UNIT_SIZE:
            self.map_for_reading()

    def discard(self) -> None:
        """Close without writing what is buffered: the hour is about to be deleted."""
        self._unflushed_log, self._unflushed_index = bytearray(), bytearray()
        self._unflushed_tombstones = bytearray()
        self._heads_dirty = False
        self.close()

    def close(self) -> None:
        self.flush()
        self._files.close()


def remove_segment(root: Path, hour: int) -> None:
    """Delete the files of ``hour``: every message in it is behind the cursor."""
    path = _segment_path(root, hour)
    for name in (LOG, INDEX, HEADS, TOMBSTONES):
        (path / name).unlink(missing_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.rmdir()


def segment_files(root: Path, hour: int) -> dict[str, int]:
    """The append-only files of ``hour`` that exist, with their sizes (heads is not one)."""
    path = _segment_path(root, hour)
    sizes = {}
    for name in APPEND_ONLY_FILES:
        with contextlib.suppress(FileNotFoundError):
            sizes[name] = (path / name).stat().st_size
    return sizes


# -- helpers: pure functions over files --------------------------------------------------------

def _segment_path(root: Path, hour: int) -> Path:
    return root / f"{hour:08d}"

