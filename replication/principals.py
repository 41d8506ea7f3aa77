"""Who asked: the principal section of the ``schedule_by``, ``cancel_by`` and ``move_by``
commands, so that every replica's ledger names the principal behind each message it files,
cancels or moves.

A ``_by`` command is its plain command (``schedule``, ``cancel``, ``move``) with this section
between the header and the plain body. The names are written once per entry, not per
message: a schedule entry packs many requests (group commit), each request's messages in a
*run* naming its principal by index::

    names  u16 count; then per name: u16 size, its UTF-8 bytes (distinct, in first use)
    runs   u32 count; then per run:  u16 name index, u32 items (messages, handles or moves)

Runs follow the body's items in order and cover all of them (checked when read, with the
command's CRC). A cancel or a move is one request: one name, one run. A principal is named
as the access file names it (at most 128 characters); ``""`` when the caller has no name of
its own (a node running ``insecure_grpc``).

Written from cluster version `tickwheel.common.versions.PRINCIPAL_VERSION` on (0.0.4 knows
no such kind); `tickwheel.replication.commands` frames them, `Requests` chooses which to
write, `Scheduling` and `Retiring` hand the names to the ledger.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

from tickwheel.common.errors import invariant

Runs = Sequence[tuple[str, int]]
"""``(principal, items)`` in the body's order."""

_COUNT: Final = struct.Struct("<H")
"""How many names; a name's size."""
_RUNS: Final = struct.Struct("<I")
# a run: name index u16, items u32
_RUN: Final = struct.Struct("<HI")
MAX_NAMES: Final = 0xFFFF
SECTION_BYTES: Final = _COUNT.size + _RUNS.size
"""A section's size besides its runs and names."""


def run_bytes(principal: str) -> int:
    """The most one request of ``principal`` adds to a section (a run and its name)."""
    return _RUN.size + _COUNT.size + len(principal.encode())


def section(runs: Runs) -> bytes:
    """The section of ``runs``; neighbouring runs of one principal are joined."""
    index: dict[str, int] = {}
    joined: list[list[int]] = []
    for principal, items in runs:
        at = index.setdefault(principal, len(index))
        if joined and joined[-1][0] == at:
            joined[-1][1] += items
        else:
            joined.append([at, items])
    invariant(len(index) <= MAX_NAMES, f"an entry names {len(index)} principals")
    parts = [_COUNT.pack(len(index))]
    for name in index:
        encoded = name.encode()
        parts += (_COUNT.pack(len(encoded)), encoded)
    parts.append(_RUNS.pack(len(joined)))
    parts += [_RUN.pack(at, items) for at, items in joined]
    return b"".join(parts)


def read_section(command: bytes, pos: int) -> tuple[list[str], int]:
    """The principal of every item, in order, and where the plain body begins."""
    (count,) = _COUNT.unpack_from(command, pos)
    pos += _COUNT.size
    names = []
    for _ in range(count):
        (size,) = _COUNT.unpack_from(command, pos)
        pos += _COUNT.size
        names.append(command[pos:pos + size].decode())
        pos += size
    (count,) = _RUNS.unpack_from(command, pos)
    pos += _RUNS.size
    end = pos + count * _RUN.size
    invariant(end <= len(command), "a principal section runs past its command")
    principals: list[str] = []
    for at, items in _RUN.iter_unpack(command[pos:end]):
        invariant(at < len(names), f"a run names principal {at} of {len(names)}")
        principals += [names[at]] * items
    return principals, end
