"""The replicated commands, as bytes: what goes into a Raft entry and how a replica reads it.

Every write to the wheel is one of four commands. Each carries the leader's clock
(``stamp_ms``) so that applying it is deterministic on every replica:

- ``schedule``: messages already encoded as wheel records (the leader encodes once; every
  replica files the same bytes), each with its due time and the dedupe key of its id.
- ``reschedule``: retry copies of delivered messages (nacked, or past their visibility
  timeout), each with the handle of the message it replaces; applying one files the copy and
  tombstones the original together (`tickwheel.replication.state`).
- ``cancel``: handles to tombstone.
- ``cursor``: the dispatch cursor to move to; with no message in flight it also keeps the stamp
  moving, which is what lets the cursor pass seconds that can no longer receive messages. It also
  carries the positions past the cursor that are already done (`DoneRun`s), so that a new leader
  does not deliver again what consumers acknowledged behind one slow message. Older readers
  ignore the runs (they read only the cursor's fixed part).

An entry is pickled by pysyncobj as one ``bytes`` argument, so pickling costs a copy, not a walk
over messages. The layout is versioned and checksummed: a replica that reads a damaged entry
stops (`InvariantViolation`) rather than diverge.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Iterator, Sequence
from enum import IntEnum
from typing import Final, NamedTuple

from tickwheel.wheel.errors import invariant
from tickwheel.wheel.format import encode_record
from tickwheel.wheel.types import Cursor, NewMessage

FORMAT_VERSION: Final = 1

# version u8, kind u8, stamp_ms i64, crc32 of everything after the header u32
_HEADER: Final = struct.Struct("<BBqI")
# how many messages (schedule) or handles (cancel) follow
_COUNT: Final = struct.Struct("<I")
# deliver_at_ms i64, dedupe key (16 bytes of BLAKE2b of the id), record size u32; then the record
_MESSAGE: Final = struct.Struct("<q16sI")
# handle of the message the copy replaces i64, the copy's deliver_at_ms i64, record size u32;
# then the copy's record
_RETRY: Final = struct.Struct("<qqI")
_HANDLE: Final = struct.Struct("<q")
# cursor second i64, cursor local_index u32; then DoneRuns to the end
_CURSOR: Final = struct.Struct("<qI")
# second i64, first local_index u32, how many consecutive local indexes u32
_DONE_RUN: Final = struct.Struct("<qII")

DEDUPE_KEY_BYTES: Final = 16
SCHEDULE_OVERHEAD_BYTES: Final = _HEADER.size + _COUNT.size
"""What a schedule or reschedule command adds around its parts (for sizing entries)."""


class Kind(IntEnum):
    SCHEDULE = 1
    CANCEL = 2
    CURSOR = 3
    RESCHEDULE = 4


class DoneRun(NamedTuple):
    """Done positions ``(second, first_local_index)`` .. ``(second, first_local_index + count
    - 1)``, past the cursor."""

    second: int
    first_local_index: int
    count: int


class RetryRecord(NamedTuple):
    """One retry copy of a reschedule command, as a replica reads it."""

    replaces_handle: int
    deliver_at_ms: int
    record: bytes


def dedupe_key(message_id: str) -> bytes:
    """The 128-bit key under which an id is remembered: small, and collisions negligible."""
    return hashlib.blake2b(message_id.encode(), digest_size=DEDUPE_KEY_BYTES).digest()


def encoded_message(message: NewMessage) -> bytes:
    """One message's part of a schedule command; the group committer joins these."""
    record = encode_record(*message)
    return _MESSAGE.pack(message.deliver_at_ms, dedupe_key(message.id), len(record)) + record


def schedule(stamp_ms: int, parts: Sequence[bytes]) -> bytes:
    """A schedule command of the `encoded_message` parts, in order."""
    return _framed(Kind.SCHEDULE, stamp_ms, _COUNT.pack(len(parts)) + b"".join(parts))


def encoded_retry(replaces_handle: int, copy: NewMessage) -> bytes:
    """One retry copy's part of a reschedule command; the group committer joins these."""
    record = encode_record(*copy)
    return _RETRY.pack(replaces_handle, copy.deliver_at_ms, len(record)) + record


def reschedule(stamp_ms: int, parts: Sequence[bytes]) -> bytes:
    """A reschedule command of the `encoded_retry` parts, in order."""
    return _framed(Kind.RESCHEDULE, stamp_ms, _COUNT.pack(len(parts)) + b"".join(parts))


def cancel(stamp_ms: int, handles: Sequence[int]) -> bytes:
    body = _COUNT.pack(len(handles)) + b"".join(_HANDLE.pack(h) for h in handles)
    return _framed(Kind.CANCEL, stamp_ms, body)


def cursor(stamp_ms: int, position: Cursor, done: Sequence[DoneRun] = ()) -> bytes:
    body = _CURSOR.pack(*position) + b"".join(_DONE_RUN.pack(*run) for run in done)
    return _framed(Kind.CURSOR, stamp_ms, body)


def read_header(command: bytes) -> tuple[Kind, int]:
    """``(kind, stamp_ms)``, after checking version and checksum."""
    invariant(len(command) >= _HEADER.size, f"command of {len(command)} bytes has no header")
    version, kind, stamp_ms, crc = _HEADER.unpack_from(command)
    invariant(version == FORMAT_VERSION, f"command format version {version} is unknown")
    invariant(zlib.crc32(memoryview(command)[_HEADER.size:]) == crc,
              "command fails its checksum")
    return Kind(kind), stamp_ms


def read_schedule(command: bytes) -> tuple[list[int], list[bytes], list[bytes]]:
    """The messages of a schedule command as three columns: due times, dedupe keys and wheel
    records, in order. Columns, not a tuple per message: every replica reads every message of
    every entry, and the state machine files them column by column."""
    (count,) = _COUNT.unpack_from(command, _HEADER.size)
    pos = _HEADER.size + _COUNT.size
    unpack_from, head_bytes = _MESSAGE.unpack_from, _MESSAGE.size
    due_ms: list[int] = []
    keys: list[bytes] = []
    records: list[bytes] = []
    add_due, add_key, add_record = due_ms.append, keys.append, records.append
    for _ in range(count):
        deliver_at_ms, key, size = unpack_from(command, pos)
        pos += head_bytes
        add_due(deliver_at_ms)
        add_key(key)
        add_record(command[pos:pos + size])
        pos += size
    invariant(pos == len(command), f"schedule command has {len(command) - pos} trailing bytes")
    return due_ms, keys, records


def read_reschedule(command: bytes) -> Iterator[RetryRecord]:
    (count,) = _COUNT.unpack_from(command, _HEADER.size)
    pos = _HEADER.size + _COUNT.size
    for _ in range(count):
        replaces_handle, deliver_at_ms, size = _RETRY.unpack_from(command, pos)
        pos += _RETRY.size
        yield RetryRecord(replaces_handle, deliver_at_ms, command[pos:pos + size])
        pos += size
    invariant(pos == len(command), f"reschedule command has {len(command) - pos} trailing "
              "bytes")


def read_cancel(command: bytes) -> list[int]:
    (count,) = _COUNT.unpack_from(command, _HEADER.size)
    start = _HEADER.size + _COUNT.size
    invariant(start + count * _HANDLE.size == len(command), "cancel command has a bad length")
    return [h for (h,) in _HANDLE.iter_unpack(command[start:])]


def read_cursor(command: bytes) -> tuple[Cursor, list[DoneRun]]:
    start = _HEADER.size + _CURSOR.size
    invariant((len(command) - start) % _DONE_RUN.size == 0, "cursor command has a bad length")
    return (Cursor(*_CURSOR.unpack_from(command, _HEADER.size)),
            [DoneRun(*run) for run in _DONE_RUN.iter_unpack(command[start:])])


def _framed(kind: Kind, stamp_ms: int, body: bytes) -> bytes:
    return _HEADER.pack(FORMAT_VERSION, kind, stamp_ms, zlib.crc32(body)) + body
