"""On-disk formats of the wheel, declared once, little-endian, versioned, each record with a CRC.

An hour segment is a folder ``hours/<hour>/`` (``hour = slot_second // 3600``) holding:

``log``
    Append-only message records: ``RECORD_HEADER`` (payload length, CRC32 of the payload)
    followed by the payload, which is ``PAYLOAD_HEADER`` and the variable fields in the
    order id, topic, properties (``PROPERTY_HEADER`` + key + value each), body.
``index``
    Append-only fixed-size ``UNIT`` entries, one per message, numbered from 0 (the
    ``global_index``). Unit *i* describes the *i*-th record of ``log``; offsets only grow.
``heads``
    ``HEADS_HEADER`` then ``SECONDS_PER_HOUR`` ``HEAD`` entries (chain head, count), one per
    second of the hour. Rewritten whole at flush; it is a checkpoint of what ``index`` implies,
    and is rebuilt from ``index`` whenever its header does not match the files.
``tombstones``
    Append-only ``TOMBSTONE`` entries: the ``global_index`` of each cancelled message.

The root folder holds ``meta``: two copies of ``META`` (the cursor and the last time stamp)
written alternately in place, each with a sequence number and a CRC; the newest valid copy wins.
"""

from __future__ import annotations

import mmap
import struct
import zlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from tickwheel.common.errors import CorruptSegment, InvalidMessage

FORMAT_VERSION: Final = 1
SECONDS_PER_HOUR: Final = 3600
MS_PER_SECOND: Final = 1000

# log record framing
RECORD_HEADER: Final = struct.Struct(
    "<I"  # payload_size_bytes
    "I"  # crc32 of the payload
)
RECORD_VERSION: Final = 2
"""Version of a log record's payload (2 added ``attempt``). Version 1 records are still read,
as attempt 1; every other format here is still at ``FORMAT_VERSION``."""
PAYLOAD_HEADER: Final = struct.Struct(
    "<B"  # record version (RECORD_VERSION)
    "H"  # id size in bytes (UTF-8)
    "H"  # topic size in bytes (UTF-8)
    "H"  # number of properties
    "I"  # body size in bytes
    "q"  # deliver_at_ms: when this copy is due
    "I"  # attempt: 1 when scheduled, + 1 for each retry copy filed after a nack
)
PAYLOAD_HEADER_V1: Final = struct.Struct(PAYLOAD_HEADER.format[:-1])  # the same without attempt
_FRAME: Final = struct.Struct(RECORD_HEADER.format + PAYLOAD_HEADER.format[1:])  # both at once
_FRAME_V1: Final = struct.Struct(RECORD_HEADER.format + PAYLOAD_HEADER_V1.format[1:])
_VERSION_AT: Final = RECORD_HEADER.size  # where the record version byte is
_ID_SIZE_AT: Final = _VERSION_AT + 1  # the id and topic sizes follow it, in both versions
_ID_AND_TOPIC_SIZES: Final = struct.Struct("<HH")
MAX_ATTEMPT: Final = 0xFFFF_FFFF
PROPERTY_HEADER: Final = struct.Struct(
    "<H"  # key size in bytes (UTF-8)
    "I"  # value size in bytes (UTF-8)
)

# one index unit per message; the chain of a second runs newest-first through pre_global_index
UNIT: Final = struct.Struct(
    "<Q"  # offset of the record in log
    "I"  # size of the record in log (header included)
    "I"  # local_index: ordinal of the message within its second
    "I"  # global_index: number of this unit in the hour's index
    "i"  # pre_global_index: previous message of the same second, -1 for the first
    "q"  # deliver_at_ms as requested (may be earlier than the slot for late filings)
    "H"  # second_of_hour the message is filed under (its slot)
    "H"  # tag: a 16-bit label the caller chose (replication: its topic's number), 0 if none
)
UNIT_CRC: Final = struct.Struct("<I")  # follows each unit: crc32 of the unit's bytes
UNIT_SIZE: Final = UNIT.size + UNIT_CRC.size
UNIT_AND_CRC: Final = struct.Struct(UNIT.format + UNIT_CRC.format[1:])  # one unpack for both

HEADS_HEADER: Final = struct.Struct(
    "<4s"  # magic b"TWHD"
    "H"  # format version
    "H"  # reserved, zero
    "I"  # units covered: index units reflected in the table
    "Q"  # log bytes covered
    "I"  # crc32 of the table
    "I"  # crc32 of the bytes above
)
HEADS_MAGIC: Final = b"TWHD"
HEAD: Final = struct.Struct(
    "<i"  # chain head: global_index of the newest message of the second, -1 if none
    "I"  # count: messages filed under the second
)
HEADS_TABLE_SIZE: Final = SECONDS_PER_HOUR * HEAD.size
HEADS_FILE_SIZE: Final = HEADS_HEADER.size + HEADS_TABLE_SIZE

TOMBSTONE: Final = struct.Struct(
    "<I"  # global_index of the cancelled message
    "I"  # crc32 of the global_index bytes, salted with the hour
)

META: Final = struct.Struct(
    "<4s"  # magic b"TWMT"
    "H"  # format version
    "H"  # reserved, zero
    "Q"  # sequence: which of the two copies is newer
    "q"  # cursor second
    "I"  # cursor local_index
    "q"  # stamp_ms: the latest time stamp applied (never decreases)
    "I"  # crc32 of the bytes above
)
META_COPIES: Final = 2  # written alternately in place; a torn write damages only the newer one
META_MAGIC: Final = b"TWMT"

_NO_PROPERTIES: Final[Mapping[str, str]] = MappingProxyType({})
MAX_ID_BYTES: Final = 0xFFFF
MAX_TOPIC_BYTES: Final = 0xFFFF
MAX_PROPERTIES: Final = 0xFFFF
MAX_PROPERTY_KEY_BYTES: Final = 0xFFFF
MAX_BODY_BYTES: Final = 0xFFFF_FFFF - 1024
MAX_PAYLOAD_BYTES: Final = 0xFFFF_FFFF  # a record's size field is 32 bits


def encode_record(
    message_id: str,
    topic: str,
    body: bytes,
    deliver_at_ms: int,
    properties: Mapping[str, str],
    attempt: int = 1,
) -> bytes:
    """Frame one message as a log record; raises `InvalidMessage` naming the field at fault."""
    id_bytes = message_id.encode()
    topic_bytes = topic.encode()
    if len(id_bytes) > MAX_ID_BYTES:
        raise InvalidMessage("id", f"is {len(id_bytes)} bytes, the format allows {MAX_ID_BYTES}")
    if len(topic_bytes) > MAX_TOPIC_BYTES:
        raise InvalidMessage("topic", f"is {len(topic_bytes)} bytes, at most {MAX_TOPIC_BYTES}")
    if len(body) > MAX_BODY_BYTES:
        raise InvalidMessage("body", f"is {len(body)} bytes, the format allows {MAX_BODY_BYTES}")
    if deliver_at_ms < 0:
        raise InvalidMessage("deliver_at_ms", f"is {deliver_at_ms}, must be >= 0")
    if not 1 <= attempt <= MAX_ATTEMPT:
        raise InvalidMessage("attempt", f"is {attempt}, must be 1 to {MAX_ATTEMPT}")
    payload = PAYLOAD_HEADER.pack(RECORD_VERSION, len(id_bytes), len(topic_bytes),
                                  len(properties), len(body), deliver_at_ms, attempt)
    payload += id_bytes + topic_bytes
    if properties:
        payload += _encode_properties(properties)
    payload += body
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise InvalidMessage("properties", f"make the record {len(payload)} bytes, over "
                             f"{MAX_PAYLOAD_BYTES}")
    return RECORD_HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def _encode_properties(properties: Mapping[str, str]) -> bytes:
    if len(properties) > MAX_PROPERTIES:
        raise InvalidMessage("properties", f"has {len(properties)} entries")
    parts: list[bytes] = []
    for key, value in properties.items():
        key_bytes, value_bytes = key.encode(), value.encode()
        if len(key_bytes) > MAX_PROPERTY_KEY_BYTES:
            raise InvalidMessage("properties", f"key of {len(key_bytes)} bytes")
        parts += (PROPERTY_HEADER.pack(len(key_bytes), len(value_bytes)), key_bytes, value_bytes)
    return b"".join(parts)


RecordFields = tuple[str, str, bytes, Mapping[str, str], int, int]
"""``(id, topic, body, properties, deliver_at_ms, attempt)`` of a record."""


def decode_record(record: bytes) -> RecordFields:
    """Inverse of `encode_record`: ``(id, topic, body, properties, deliver_at_ms, attempt)``.

    Verifies framing and CRC; raises `CorruptSegment` on any mismatch (the caller, which knows
    the file and offset, adds them). A version 1 record is attempt 1.
    """
    version = record[_VERSION_AT] if len(record) > _VERSION_AT else None
    frame = _FRAME_V1 if version == 1 else _FRAME
    if len(record) < frame.size:
        raise CorruptSegment("record", f"{len(record)} bytes is shorter than its header")
    payload_size, crc, _, id_size, topic_size, n_props, body_size, deliver_at_ms, *rest = (
        frame.unpack_from(record))
    if len(record) - RECORD_HEADER.size != payload_size or zlib.crc32(
            memoryview(record)[RECORD_HEADER.size:]) != crc:
        raise CorruptSegment("record", "length or CRC32 mismatch")
    if version not in (1, RECORD_VERSION):
        raise CorruptSegment("record", f"record version {version}, expected 1 or "
                             f"{RECORD_VERSION}")
    attempt = rest[0] if rest else 1
    pos = frame.size
    message_id = record[pos:pos + id_size].decode()
    pos += id_size
    topic = record[pos:pos + topic_size].decode()
    pos += topic_size
    properties: Mapping[str, str] = _NO_PROPERTIES
    if n_props:
        properties, pos = _decode_properties(record, pos, n_props)
    if pos + body_size != len(record):
        raise CorruptSegment("record", "fields do not add up to its length")
    return message_id, topic, record[pos:], properties, deliver_at_ms, attempt


def decode_record_key(record: bytes) -> tuple[str, str, int]:
    """``(id, topic, attempt)`` of a record, checked as `decode_record` checks it (framing,
    CRC, version) but with its properties and body left unread: what the ledger records of a
    message scheduled, at half the cost."""
    size = len(record)
    version = record[_VERSION_AT] if size > _VERSION_AT else None
    frame = _FRAME_V1 if version == 1 else _FRAME
    if size < frame.size:
        raise CorruptSegment("record", f"{size} bytes is shorter than its header")
    payload_size, crc, _, id_size, topic_size, _, _, _, *rest = frame.unpack_from(record)
    if size - RECORD_HEADER.size != payload_size or zlib.crc32(
            record[RECORD_HEADER.size:]) != crc:
        raise CorruptSegment("record", "length or CRC32 mismatch")
    if version not in (1, RECORD_VERSION):
        raise CorruptSegment("record", f"record version {version}, expected 1 or "
                             f"{RECORD_VERSION}")
    at = frame.size + id_size
    if at + topic_size > size:
        raise CorruptSegment("record", "fields do not add up to its length")
    return (record[frame.size:at].decode(), record[at:at + topic_size].decode(),
            rest[0] if rest else 1)


def _decode_properties(record: bytes, pos: int, count: int) -> tuple[dict[str, str], int]:
    properties = {}
    for _ in range(count):
        key_size, value_size = PROPERTY_HEADER.unpack_from(record, pos)
        pos += PROPERTY_HEADER.size
        key = record[pos:pos + key_size].decode()
        pos += key_size
        properties[key] = record[pos:pos + value_size].decode()
        pos += value_size
    return properties, pos


def pack_unit(
    offset: int, size: int, local_index: int, global_index: int, pre_global_index: int,
    deliver_at_ms: int, second_of_hour: int, tag: int = 0,
) -> bytes:
    """One index unit with its CRC."""
    body = UNIT.pack(offset, size, local_index, global_index, pre_global_index, deliver_at_ms,
                     second_of_hour, tag)
    return body + UNIT_CRC.pack(zlib.crc32(body))


def unpack_unit(data: bytes | bytearray | memoryview | mmap.mmap, pos: int = 0
                ) -> tuple[int, ...] | None:
    """The fields of the unit at ``pos`` (CRC excluded), or None if its CRC does not match."""
    fields = UNIT_AND_CRC.unpack_from(data, pos)
    if zlib.crc32(data[pos:pos + UNIT.size]) != fields[8]:
        return None
    return fields[:8]


def record_topics(records: list[bytes]) -> list[bytes]:
    """The topic of each `encode_record` record, still UTF-8 (a cheap key for callers that
    look topics up per record), without decoding the rest (no CRC check: the caller holds
    bytes it framed or already checked). One loop for the batch: replicas call this for every
    message they file."""
    topics: list[bytes] = []
    add = topics.append
    unpack_sizes, v1_frame, frame = _ID_AND_TOPIC_SIZES.unpack_from, _FRAME_V1.size, _FRAME.size
    for record in records:
        id_size, topic_size = unpack_sizes(record, _ID_SIZE_AT)
        start = (v1_frame if record[_VERSION_AT] == 1 else frame) + id_size
        add(record[start:start + topic_size])
    return topics


def pack_tombstone(hour: int, global_index: int) -> bytes:
    return TOMBSTONE.pack(global_index, _tombstone_crc(hour, global_index))


def _tombstone_crc(hour: int, global_index: int) -> int:
    return zlib.crc32(global_index.to_bytes(4, "little"), hour & 0xFFFF_FFFF)


def unpack_tombstones(hour: int, data: bytes) -> list[int]:
    """Global indexes of the valid tombstones in ``data``; a torn or corrupt entry ends the list."""
    found = []
    for global_index, crc in TOMBSTONE.iter_unpack(data[: len(data) // TOMBSTONE.size *
                                                         TOMBSTONE.size]):
        if crc != _tombstone_crc(hour, global_index):
            break
        found.append(global_index)
    return found


def pack_heads(table: bytes, units: int, log_size_bytes: int) -> bytes:
    """A whole heads file: header (with the CRC of ``table``) followed by ``table``."""
    head = HEADS_HEADER.pack(HEADS_MAGIC, FORMAT_VERSION, 0, units, log_size_bytes,
                             zlib.crc32(table), 0)[:-4]
    return head + zlib.crc32(head).to_bytes(4, "little") + table


def unpack_heads(data: bytes) -> tuple[int, int, memoryview] | None:
    """``(units, log_size_bytes, table)`` of a heads file, or None if it is torn or corrupt."""
    if len(data) != HEADS_FILE_SIZE:
        return None
    magic, version, _, units, log_size, table_crc, header_crc = HEADS_HEADER.unpack_from(data)
    table = memoryview(data)[HEADS_HEADER.size:]
    if (magic != HEADS_MAGIC or version != FORMAT_VERSION
            or zlib.crc32(data[:HEADS_HEADER.size - 4]) != header_crc
            or zlib.crc32(table) != table_crc):
        return None
    return units, log_size, table


def pack_meta(sequence: int, cursor_second: int, cursor_local_index: int,
              stamp_ms: int) -> bytes:
    """One copy of the meta record; it belongs at offset ``(sequence % META_COPIES) * size``."""
    body = META.pack(META_MAGIC, FORMAT_VERSION, 0, sequence, cursor_second, cursor_local_index,
                     stamp_ms, 0)[:-4]
    return body + zlib.crc32(body).to_bytes(4, "little")


def unpack_meta(data: bytes, where: str) -> tuple[int, int, int, int] | None:
    """``(sequence, cursor_second, cursor_local_index, stamp_ms)`` of the newest valid copy;
    None for an empty file; `CorruptSegment` if no copy is valid."""
    if not data:
        return None
    copies = []
    for position in range(0, min(len(data), META_COPIES * META.size) - META.size + 1, META.size):
        magic, version, _, sequence, second, local_index, stamp_ms, crc = META.unpack_from(
            data, position)
        if (magic == META_MAGIC and version == FORMAT_VERSION
                and zlib.crc32(data[position:position + META.size - 4]) == crc):
            copies.append((sequence, second, local_index, stamp_ms))
    if not copies:
        raise CorruptSegment(where, "no copy of meta passes its magic, version and CRC32")
    return max(copies)
