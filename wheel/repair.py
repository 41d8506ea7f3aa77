"""Opening an hour's files, whatever a crash left of them.

The fast path reads only the heads file: when its header matches the sizes of index and log
exactly, nothing else is read. Otherwise the tail is repaired: the index is cut to its last
unit that is whole, passes its CRC and points inside the log; the log is cut after that unit's
record; heads are replayed from the index (from the checkpoint when it is still a prefix, else
from the start) and written back. A unit or tombstone that fails its CRC inside the files (not
at their end) is mended from a copy (`Mender`).
"""

from __future__ import annotations

import mmap
import os
import sys
from array import array
from pathlib import Path
from typing import NamedTuple

from tickwheel.common.errors import CorruptSegment, InvariantViolation
from tickwheel.wheel.fileio import HEADS, INDEX, LOG, TOMBSTONES, file_size, overwrite, read_file
from tickwheel.wheel.format import (
    HEAD,
    SECONDS_PER_HOUR,
    TOMBSTONE,
    UNIT_SIZE,
    decode_record,
    pack_tombstone,
    unpack_heads,
    unpack_tombstones,
    unpack_unit,
)
from tickwheel.wheel.mending import Mender, Unmended

_SCAN_CHUNK_UNITS = 65_536
_LITTLE_ENDIAN = sys.byteorder == "little"
assert HEAD.format == "<iI", "the heads table is kept as array('i') of (head, count) pairs"


class Opened(NamedTuple):
    """What an hour's files hold once opened: its chain heads, how many units and log bytes,
    its tombstones, and whether anything was repaired (then heads must be written back)."""

    heads: array[int]
    units: int
    log_size: int
    tombstones: set[int]
    repaired: bool


def open_hour(path: Path, hour: int, mender: Mender) -> Opened:
    """Open (creating if absent) the files of ``hour`` in ``path``, repairing torn tails."""
    if not path.exists():
        path.mkdir(parents=True)
        return Opened(empty_heads(), 0, 0, set(), repaired=False)
    index_size = file_size(path / INDEX)
    log_size = file_size(path / LOG)
    checkpoint = unpack_heads(read_file(path / HEADS))
    if (checkpoint is not None and index_size == checkpoint[0] * UNIT_SIZE
            and log_size == checkpoint[1]):
        units = checkpoint[0]
        heads = _heads_from(checkpoint[2])
        repaired = False
    else:
        units, log_size = _repair_tail(path, index_size, log_size)
        if checkpoint is not None and checkpoint[0] <= units:
            heads, start = _heads_from(checkpoint[2]), checkpoint[0]
        else:
            heads, start = empty_heads(), 0
        _replay(path, heads, start, units, mender)
        repaired = True
    tombstones = _load_tombstones(path, hour, units, mender)
    return Opened(heads, units, log_size, tombstones, repaired)


def empty_heads() -> array[int]:
    return array("i", [-1, 0]) * SECONDS_PER_HOUR


def _heads_from(table: memoryview) -> array[int]:
    heads = array("i")
    heads.frombytes(table)
    if not _LITTLE_ENDIAN:
        heads.byteswap()
    return heads


def heads_table(heads: array[int]) -> bytes:
    """``heads`` as the heads file stores them, little-endian (`_heads_from` reads them back)."""
    if _LITTLE_ENDIAN:
        return heads.tobytes()
    swapped = array("i", heads)
    swapped.byteswap()
    return swapped.tobytes()


# The last byte of a little-endian chain head is 0xFF only for -1 (an empty second), since heads
# are below 2**31: one translate turns those bytes into a string of binary digits.
_OCCUPIED_DIGIT = bytes.maketrans(bytes(range(256)), b"1" * 255 + b"0")


def occupancy(heads: array[int]) -> int:
    """Bit ``s`` set when second ``s`` holds a message."""
    if not _LITTLE_ENDIAN:
        return sum(1 << second for second, count in enumerate(heads[1::2]) if count)
    digits = heads.tobytes()[3::HEAD.size].translate(_OCCUPIED_DIGIT)
    return int(digits[::-1], 2)


def _repair_tail(path: Path, index_size: int, log_size: int) -> tuple[int, int]:
    """Cut index and log back to their longest consistent prefix; returns (units, log size)."""
    units, end = index_size // UNIT_SIZE, 0
    with open(path / INDEX, "a+b") as index:
        while units:
            fields = unpack_unit(os.pread(index.fileno(), UNIT_SIZE, (units - 1) * UNIT_SIZE))
            if fields is not None and fields[3] == units - 1 and fields[0] + fields[1] <= log_size:
                end = fields[0] + fields[1]
                break
            units -= 1
        index.truncate(units * UNIT_SIZE)
    with open(path / LOG, "a+b") as log:
        log.truncate(end)
    return units, end


def _replay(path: Path, heads: array[int], start: int, units: int, mender: Mender) -> None:
    """Apply index units ``[start, units)`` to ``heads``, checking every chain link (and
    mending a unit that fails its CRC)."""
    with open(path / INDEX, "rb") as index:
        for chunk_start in range(start, units, _SCAN_CHUNK_UNITS):
            count = min(_SCAN_CHUNK_UNITS, units - chunk_start)
            data = os.pread(index.fileno(), count * UNIT_SIZE, chunk_start * UNIT_SIZE)
            for i in range(count):
                global_index = chunk_start + i
                try:
                    fields = checked_unit(data, i * UNIT_SIZE, global_index, path)
                except CorruptSegment as damage:
                    fields = mended_unit(mender, path, global_index, damage)
                slot = fields[6] << 1
                if fields[4] != heads[slot] or fields[2] != heads[slot + 1]:
                    raise CorruptSegment(str(path / INDEX), f"unit {global_index} breaks its "
                                         "second's chain")
                heads[slot] = global_index
                heads[slot + 1] += 1


def mended_unit(mender: Mender, path: Path, global_index: int,
                 damage: CorruptSegment) -> tuple[int, ...]:
    """Unit ``global_index`` of ``path``'s index, which failed its check, from a good copy."""

    def good(copy: bytes) -> bool:
        fields = unpack_unit(copy)
        return fields is not None and fields[3] == global_index

    fields = unpack_unit(mender.mend(path / INDEX, global_index * UNIT_SIZE, UNIT_SIZE, good,
                                     damage))
    if fields is None:
        raise InvariantViolation(f"{path}: mended unit {global_index} fails its check")
    return fields


def decodes(record: bytes) -> bool:
    try:
        decode_record(record)
    except CorruptSegment:
        return False
    return True


def checked_unit(data: bytes | bytearray | memoryview | mmap.mmap, pos: int,
                  global_index: int, path: Path) -> tuple[int, ...]:
    """The fields of unit ``global_index`` stored at ``pos`` of ``data``; `CorruptSegment` if
    it fails its CRC or is not the unit it should be."""
    fields = unpack_unit(data, pos)
    if fields is None or fields[3] != global_index:
        raise CorruptSegment(str(path / INDEX), f"unit {global_index} is damaged")
    return fields


def _load_tombstones(path: Path, hour: int, units: int, mender: Mender) -> set[int]:
    """The valid tombstones; a torn tail, or one naming a unit that was cut, is dropped. A
    whole entry that fails its CRC with more after it is damage, not a torn write: it is
    mended from a copy (and dropped with the rest only if none has it)."""
    data = read_file(path / TOMBSTONES)
    found = unpack_tombstones(hour, data)
    while (len(found) + 1) * TOMBSTONE.size < len(data):
        offset = len(found) * TOMBSTONE.size
        damage = CorruptSegment(str(path / TOMBSTONES), f"tombstone {len(found)} is damaged")
        try:
            copy = mender.mend(path / TOMBSTONES, offset, TOMBSTONE.size,
                               lambda entry: len(unpack_tombstones(hour, entry)) == 1, damage)
        except Unmended:
            break
        data = data[:offset] + copy + data[offset + TOMBSTONE.size:]
        found = unpack_tombstones(hour, data)
    kept = [g for g in found if g < units]
    expected = b"".join(pack_tombstone(hour, g) for g in kept)
    if expected != data:
        fd = os.open(path / TOMBSTONES, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            overwrite(fd, expected)
        finally:
            os.close(fd)
    return set(kept)
