"""The replicated commands, as bytes: what goes into a Raft entry and how a replica reads it.

Every write to the replicated state is one of these commands. Each carries the leader's clock
(``stamp_ms``) so that applying it is deterministic on every replica:

- ``schedule``: messages already encoded as wheel records (the leader encodes once; every
  replica files the same bytes), each with its due time and the dedupe key of its id.
- ``reschedule``: retry copies of delivered messages (nacked, or past their visibility
  timeout), each with the handle of the message it replaces; applying one files the copy and
  tombstones the original together (`tickwheel.replication.state`).
- ``cancel``: handles to tombstone.
- ``cursor``: the dispatch cursor to move to; with no message in flight it also keeps the stamp
  moving, which is what lets the cursor pass seconds that can no longer receive messages.
  (Entries written before consumer groups carry done runs after it; they are ignored.)
- ``barrier``: a new leader's first command, a cursor command that also ends every stream lease
  (`tickwheel.replication.groups`).
- ``handout``: messages that came due, readied for their groups, and leases granted on ready
  messages; a message is sent to a consumer only once its lease is applied.
- ``leases``: acks, releases and deadline changes of leases, by receipt (`LeaseRef`).
- ``group``: create or delete a consumer group.
- ``retry``: like ``reschedule``, for a leased message: resolves the lease and files the copy.
- ``move``: handles of pending messages, each with a new due time (the Reschedule call).
- ``shard_map``: a new version of the cluster's shard map (shards added); from the entry on,
  the shard takes only the messages the new map gives it (`tickwheel.replication.requests`).
  Written only from cluster version 2 on (`tickwheel.common.versions`).
- ``schedule_by``, ``cancel_by``, ``move_by``: ``schedule``, ``cancel``, ``move`` with who asked
  (`tickwheel.replication.principals`), for the ledger. Written from cluster version 2 on.
- ``finalize``: the cluster version from this entry on (``tickwheel upgrade finalize``); a
  release that does not know the version it names stops rather than write older formats.

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

from tickwheel.common.errors import invariant
from tickwheel.replication.principals import Runs, read_section, section
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
# a move: handle, new deliver_at_ms
_MOVE: Final = struct.Struct("<qq")
# cursor second i64, cursor local_index u32; then DoneRuns to the end
_CURSOR: Final = struct.Struct("<qI")
# the size of a done run (second i64, first local_index u32, count u32) in first-wave entries
_DONE_RUN_BYTES: Final = 16

DEDUPE_KEY_BYTES: Final = 16
HANDLE_KEY_BYTES: Final = 16
"""The cluster's handle key (`tickwheel.replication.handle_cipher`), carried by a barrier."""
SCHEDULE_OVERHEAD_BYTES: Final = _HEADER.size + _COUNT.size
"""What a schedule or reschedule command adds around its parts (for sizing entries)."""


class Kind(IntEnum):
    SCHEDULE = 1
    CANCEL = 2
    CURSOR = 3
    RESCHEDULE = 4
    """Retry copies of the first wave (before groups), replayed from old journals only."""
    HANDOUT = 5
    LEASES = 6
    GROUP = 7
    RETRY = 8
    BARRIER = 9
    MOVE = 10
    SHARD_MAP = 11
    FINALIZE = 12
    SCHEDULE_BY = 13
    CANCEL_BY = 14
    MOVE_BY = 15


class LeaseOp(IntEnum):
    ACK = 1
    RELEASE = 2
    EXTEND = 3
    RETURN = 4
    """A release of leases whose messages were never sent: they do not count as handed out to
    the next delivery's ``possible_duplicate``."""


# strings of a handout: count u16, then per string its size u16 and its UTF-8 bytes
_STRINGS: Final = struct.Struct("<H")
# a readied message: handle, slot second, local index, topic (string index), target group
# (string index, -1 for every group of the topic)
_READY: Final = struct.Struct("<qqIhh")
# a grant: handle, topic and group (string indexes), nonce, deadline_ms, mode
_GRANT: Final = struct.Struct("<qhhQqB")
# a lease reference: group id, handle, seq, nonce; and deadline_ms (EXTEND; else 0)
_LEASE: Final = struct.Struct("<IqIQq")
# a retry of a leased message: group id, handle, seq, nonce, the copy's deliver_at_ms, its
# record's size; then the record
_LEASED_RETRY: Final = struct.Struct("<IqIQqI")
_OP: Final = struct.Struct("<B")
_BY: Final = {Kind.SCHEDULE: Kind.SCHEDULE_BY, Kind.CANCEL: Kind.CANCEL_BY, Kind.MOVE: Kind.MOVE_BY}


class Ready(NamedTuple):
    handle: int
    second: int
    local_index: int
    topic: str
    target: str | None
    """The only group a retry copy is for; None: every group of its topic."""


class Grant(NamedTuple):
    handle: int
    topic: str
    group: str
    nonce: int
    deadline_ms: int
    mode: int


class LeaseRef(NamedTuple):
    """One lease of one message in one group, as a receipt names it."""

    group_id: int
    handle: int
    seq: int
    nonce: int


class LeasedRetry(NamedTuple):
    lease: LeaseRef
    deliver_at_ms: int
    record: bytes


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


def schedule(stamp_ms: int, parts: Sequence[bytes], runs: Runs | None = None) -> bytes:
    """A schedule command of the `encoded_message` parts, in order (``runs``: a schedule_by)."""
    return _by(Kind.SCHEDULE, stamp_ms, _COUNT.pack(len(parts)) + b"".join(parts), runs)


def encoded_retry(replaces_handle: int, copy: NewMessage) -> bytes:
    """One retry copy's part of a reschedule command; the group committer joins these."""
    record = encode_record(*copy)
    return _RETRY.pack(replaces_handle, copy.deliver_at_ms, len(record)) + record


def reschedule(stamp_ms: int, parts: Sequence[bytes]) -> bytes:
    """A reschedule command of the `encoded_retry` parts, in order."""
    return _framed(Kind.RESCHEDULE, stamp_ms, _COUNT.pack(len(parts)) + b"".join(parts))


def cancel(stamp_ms: int, handles: Sequence[int], principal: str | None = None) -> bytes:
    body = _COUNT.pack(len(handles)) + b"".join(_HANDLE.pack(h) for h in handles)
    return _by(Kind.CANCEL, stamp_ms, body, [(principal, len(handles))] if principal else None)


def move(stamp_ms: int, moves: Sequence[tuple[int, int]], principal: str | None = None) -> bytes:
    """Pending messages to move: ``(handle, deliver_at_ms)`` each (``principal``: a move_by)."""
    body = _COUNT.pack(len(moves)) + b"".join(_MOVE.pack(*m) for m in moves)
    return _by(Kind.MOVE, stamp_ms, body, [(principal, len(moves))] if principal else None)


def cursor(stamp_ms: int, position: Cursor) -> bytes:
    return _framed(Kind.CURSOR, stamp_ms, _CURSOR.pack(*position))


def barrier(stamp_ms: int, position: Cursor, handle_key: bytes | None = None) -> bytes:
    """A new leader's first command: the cursor, and a handle key for a cluster that has
    none yet (the first barrier that carries one sets it, everywhere)."""
    return _framed(Kind.BARRIER, stamp_ms, _CURSOR.pack(*position) + (handle_key or b""))


def read_barrier(command: bytes) -> tuple[Cursor, bytes | None]:
    start = _HEADER.size + _CURSOR.size
    invariant(len(command) in (start, start + HANDLE_KEY_BYTES), "barrier has a bad length")
    key = command[start:] or None
    return Cursor(*_CURSOR.unpack_from(command, _HEADER.size)), key


def handout(stamp_ms: int, ready: Sequence[Ready], grants: Sequence[Grant]) -> bytes:
    """Messages readied for their groups, then leases granted (on those or on messages
    readied earlier), in that order."""
    index: dict[str, int] = {}
    for item in ready:
        index.setdefault(item.topic, len(index))
        if item.target is not None:
            index.setdefault(item.target, len(index))
    for grant in grants:
        index.setdefault(grant.topic, len(index))
        index.setdefault(grant.group, len(index))
    invariant(len(index) < 0x7FFF, f"a handout names {len(index)} strings")
    parts = [_STRINGS.pack(len(index))]
    for text in index:
        encoded = text.encode()
        parts += (_STRINGS.pack(len(encoded)), encoded)
    parts.append(_COUNT.pack(len(ready)))
    parts += [_READY.pack(r.handle, r.second, r.local_index, index[r.topic],
                          -1 if r.target is None else index[r.target]) for r in ready]
    parts.append(_COUNT.pack(len(grants)))
    parts += [_GRANT.pack(g.handle, index[g.topic], index[g.group], g.nonce, g.deadline_ms,
                          g.mode) for g in grants]
    return _framed(Kind.HANDOUT, stamp_ms, b"".join(parts))


class HandoutRows(NamedTuple):
    """A handout command as its rows: string indexes stand for topics and groups."""

    strings: list[str]
    ready: list[tuple[int, int, int, int, int]]
    """``(handle, second, local_index, topic, target)``; target -1: every group."""
    grants: list[tuple[int, int, int, int, int, int]]
    """``(handle, topic, group, nonce, deadline_ms, mode)``."""


def read_handout(command: bytes) -> HandoutRows:
    """The rows as struct unpacks them (every replica reads every hand-out: a named tuple
    per row cost a third of the apply)."""
    pos = _HEADER.size
    (count,) = _STRINGS.unpack_from(command, pos)
    pos += _STRINGS.size
    strings = []
    for _ in range(count):
        (size,) = _STRINGS.unpack_from(command, pos)
        pos += _STRINGS.size
        strings.append(command[pos:pos + size].decode())
        pos += size
    (count,) = _COUNT.unpack_from(command, pos)
    pos += _COUNT.size
    end = pos + count * _READY.size
    ready = list(_READY.iter_unpack(command[pos:end]))
    (count,) = _COUNT.unpack_from(command, end)
    pos = end + _COUNT.size
    end = pos + count * _GRANT.size
    invariant(end == len(command), "handout command has a bad length")
    return HandoutRows(strings, ready, list(_GRANT.iter_unpack(command[pos:end])))


def leases(stamp_ms: int, op: LeaseOp, refs: Sequence[LeaseRef],
           deadlines_ms: Sequence[int] = ()) -> bytes:
    """Acks, releases, or new deadlines (``deadlines_ms``, one per lease) of leases."""
    deadlines = deadlines_ms or [0] * len(refs)
    body = _OP.pack(op) + _COUNT.pack(len(refs)) + b"".join(
        _LEASE.pack(*ref, deadline) for ref, deadline in zip(refs, deadlines, strict=True))
    return _framed(Kind.LEASES, stamp_ms, body)


def read_leases(command: bytes) -> tuple[LeaseOp, list[tuple[LeaseRef, int]]]:
    (op,) = _OP.unpack_from(command, _HEADER.size)
    (count,) = _COUNT.unpack_from(command, _HEADER.size + _OP.size)
    start = _HEADER.size + _OP.size + _COUNT.size
    invariant(start + count * _LEASE.size == len(command), "leases command has a bad length")
    new = tuple.__new__  # a LeaseRef straight from the unpacked row: no Python frame each
    return LeaseOp(op), [(new(LeaseRef, row[:4]), row[4])
                         for row in _LEASE.iter_unpack(command[start:])]


def group(stamp_ms: int, create: bool, topic: str, name: str) -> bytes:
    topic_bytes, name_bytes = topic.encode(), name.encode()
    body = (_OP.pack(1 if create else 0) + _STRINGS.pack(len(topic_bytes)) + topic_bytes
            + _STRINGS.pack(len(name_bytes)) + name_bytes)
    return _framed(Kind.GROUP, stamp_ms, body)


def shard_map(stamp_ms: int, version: int, body: bytes) -> bytes:
    """Shard map ``version`` (u32), then its description (the node's JSON, opaque here)."""
    return _framed(Kind.SHARD_MAP, stamp_ms, _COUNT.pack(version) + body)


def read_shard_map(command: bytes) -> tuple[int, bytes]:
    (version,) = _COUNT.unpack_from(command, _HEADER.size)
    return version, command[_HEADER.size + _COUNT.size:]


def finalize(stamp_ms: int, version: int) -> bytes:
    """Cluster version ``version`` (u32) from this entry on."""
    return _framed(Kind.FINALIZE, stamp_ms, _COUNT.pack(version))


def read_finalize(command: bytes) -> int:
    (version,) = _COUNT.unpack_from(command, _HEADER.size)
    return int(version)


def read_group(command: bytes) -> tuple[bool, str, str]:
    (create,) = _OP.unpack_from(command, _HEADER.size)
    pos = _HEADER.size + _OP.size
    (size,) = _STRINGS.unpack_from(command, pos)
    topic = command[pos + _STRINGS.size:pos + _STRINGS.size + size].decode()
    pos += _STRINGS.size + size
    (size,) = _STRINGS.unpack_from(command, pos)
    name = command[pos + _STRINGS.size:pos + _STRINGS.size + size].decode()
    invariant(pos + _STRINGS.size + size == len(command), "group command has a bad length")
    return bool(create), topic, name


def encoded_leased_retry(lease: LeaseRef, copy: NewMessage) -> bytes:
    """One part of a retry command; the group committer joins these."""
    record = encode_record(*copy)
    return _LEASED_RETRY.pack(*lease, copy.deliver_at_ms, len(record)) + record


def read_retry_lease(part: bytes) -> LeaseRef:
    """The lease of one `encoded_leased_retry` part."""
    return LeaseRef(*_LEASED_RETRY.unpack_from(part)[:4])


def retry(stamp_ms: int, parts: Sequence[bytes]) -> bytes:
    return _framed(Kind.RETRY, stamp_ms, _COUNT.pack(len(parts)) + b"".join(parts))


def read_retry(command: bytes) -> Iterator[LeasedRetry]:
    (count,) = _COUNT.unpack_from(command, _HEADER.size)
    pos = _HEADER.size + _COUNT.size
    for _ in range(count):
        group_id, handle, seq, nonce, deliver_at_ms, size = _LEASED_RETRY.unpack_from(
            command, pos)
        pos += _LEASED_RETRY.size
        yield LeasedRetry(LeaseRef(group_id, handle, seq, nonce), deliver_at_ms,
                          command[pos:pos + size])
        pos += size
    invariant(pos == len(command), f"retry command has {len(command) - pos} trailing bytes")


def read_header(command: bytes) -> tuple[Kind, int]:
    """``(kind, stamp_ms)``, after checking version and checksum."""
    invariant(len(command) >= _HEADER.size, f"command of {len(command)} bytes has no header")
    version, kind, stamp_ms, crc = _HEADER.unpack_from(command)
    invariant(version == FORMAT_VERSION, f"command format version {version} is unknown")
    invariant(zlib.crc32(memoryview(command)[_HEADER.size:]) == crc,
              "command fails its checksum")
    return Kind(kind), stamp_ms


def read_schedule(command: bytes) -> tuple[list[int], list[bytes], list[bytes], list[str]]:
    """A schedule's (or schedule_by's) messages as columns: due times, dedupe keys, records and
    who asked (``""``: a plain schedule). Columns, not a tuple per message: every replica reads
    every message of every entry, and the state machine files them column by column."""
    principals, start = _section(command)
    (count,) = _COUNT.unpack_from(command, start)
    pos = start + _COUNT.size
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
    invariant(principals is None or len(principals) == count, "runs do not cover the schedule")
    return due_ms, keys, records, [""] * count if principals is None else principals


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


def read_cancel(command: bytes) -> tuple[list[int], str]:
    """A cancel's (or cancel_by's) handles, and who asked (``""``: a plain cancel)."""
    count, start, principal = _items(command)
    invariant(start + count * _HANDLE.size == len(command), "cancel command has a bad length")
    return [h for (h,) in _HANDLE.iter_unpack(command[start:])], principal


def read_move(command: bytes) -> tuple[list[tuple[int, int]], str]:
    """A move's (or move_by's) moves, and who asked (``""``: a plain move)."""
    count, start, principal = _items(command)
    invariant(start + count * _MOVE.size == len(command), "move command has a bad length")
    return list(_MOVE.iter_unpack(command[start:])), principal


def read_cursor(command: bytes) -> Cursor:
    """The cursor of a cursor command (done runs after it, in entries of the first wave, are
    ignored: the readied positions replaced them)."""
    start = _HEADER.size + _CURSOR.size
    invariant((len(command) - start) % _DONE_RUN_BYTES == 0, "cursor command has a bad length")
    return Cursor(*_CURSOR.unpack_from(command, _HEADER.size))


def _by(kind: Kind, stamp_ms: int, body: bytes, runs: Runs | None) -> bytes:
    """``kind``'s command of ``body``; with ``runs``, its ``_by`` kind's."""
    return (_framed(kind, stamp_ms, body) if runs is None
            else _framed(_BY[kind], stamp_ms, section(runs) + body))


def _section(command: bytes) -> tuple[list[str] | None, int]:
    """A ``_by`` command's principals (None: another kind), and where its plain body begins."""
    if command[1] not in _BY.values():
        return None, _HEADER.size
    return read_section(command, _HEADER.size)


def _items(command: bytes) -> tuple[int, int, str]:
    """A cancel's or move's count of items, where they begin, and who asked for them."""
    principals, body = _section(command)
    (count,) = _COUNT.unpack_from(command, body)
    return count, body + _COUNT.size, principals[0] if principals else ""


def _framed(kind: Kind, stamp_ms: int, body: bytes) -> bytes:
    return _HEADER.pack(FORMAT_VERSION, kind, stamp_ms, zlib.crc32(body)) + body
