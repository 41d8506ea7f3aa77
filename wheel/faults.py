"""Where a stopped wheel's bytes lie, for fault injection: the face the chaos runner damages hour
segments through (`tickwheel.chaos.storage`), so that nothing above the storage layers reads the
wheel's formats (`tickwheel.wheel.format`) itself.

It locates, and never changes: the hour folders worth damaging, how many index units an hour
holds, the bytes of one unit, and the bytes of one record's payload in the hour's ``log``
(past its header, so that damage there is caught by the record's CRC, not by its framing).
The damage itself is the caller's: the wheel's job is to notice it (docs/wheel.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from tickwheel.wheel.format import RECORD_HEADER, UNIT, UNIT_SIZE
from tickwheel.wheel.hours import HOURS_DIR

UNIT_BYTES: Final = UNIT_SIZE
"""The size of one index unit, its CRC included."""
LOG: Final = "log"
INDEX: Final = "index"
"""An hour folder's two files: the records, and one unit per message."""


def hour_folders(wheel_dir: Path) -> list[Path]:
    """The hour folders under ``wheel_dir`` that hold at least two index units (damage to the
    last unit alone reads as a torn write), in the order of their hours."""
    root = wheel_dir / HOURS_DIR
    if not root.exists():
        return []
    return sorted(folder for folder in root.iterdir() if (folder / INDEX).exists()
                  and (folder / INDEX).stat().st_size >= 2 * UNIT_BYTES)


def units(index_bytes: int) -> int:
    """How many whole units an index of ``index_bytes`` holds."""
    return index_bytes // UNIT_BYTES


def unit_span(unit: int) -> range:
    """The bytes of the index unit ``unit``, in its hour's ``index``."""
    return range(unit * UNIT_BYTES, (unit + 1) * UNIT_BYTES)


def payload_span(index: bytes, unit: int) -> range:
    """The bytes of the payload of the record that unit ``unit`` of ``index`` (an hour's whole
    ``index`` file) points at, in its hour's ``log``."""
    offset, size = UNIT.unpack_from(index, unit * UNIT_BYTES)[:2]
    return range(offset + RECORD_HEADER.size, offset + size)
