"""The binary formats: round trips, and every damaged byte is caught."""

from __future__ import annotations

import zlib

import hypothesis.strategies as st
import pytest
from hypothesis import given

from tickwheel.wheel import CorruptSegment
from tickwheel.wheel.format import (
    PAYLOAD_HEADER_V1,
    RECORD_HEADER,
    decode_record,
    decode_record_key,
    encode_record,
    pack_heads,
    pack_meta,
    pack_unit,
    unpack_heads,
    unpack_meta,
    unpack_unit,
)

records = st.tuples(st.text(max_size=20), st.text(max_size=20), st.binary(max_size=200),
                    st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=4),
                    st.integers(0, 2**62), st.integers(1, 2**32 - 1))


@given(records)
def test_records_round_trip(fields: tuple) -> None:
    message_id, topic, body, properties, deliver_at_ms, attempt = fields
    record = encode_record(message_id, topic, body, deliver_at_ms, properties, attempt)
    assert decode_record(record) == (message_id, topic, body, properties, deliver_at_ms,
                                     attempt)
    assert decode_record_key(record) == (message_id, topic, attempt)


def test_a_version_1_record_without_an_attempt_reads_as_attempt_1() -> None:
    payload = PAYLOAD_HEADER_V1.pack(1, 2, 6, 0, 4, 1_800_000_000_000) + b"idorders" + b"body"
    record = RECORD_HEADER.pack(len(payload), zlib.crc32(payload)) + payload
    assert decode_record(record) == ("id", "orders", b"body", {}, 1_800_000_000_000, 1)
    assert decode_record_key(record) == ("id", "orders", 1)


@given(records, st.data())
def test_any_flipped_bit_in_a_record_is_caught(fields: tuple, data: st.DataObject) -> None:
    message_id, topic, body, properties, deliver_at_ms, attempt = fields
    record = bytearray(encode_record(message_id, topic, body, deliver_at_ms, properties,
                                     attempt))
    position = data.draw(st.integers(0, len(record) - 1))
    record[position] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(CorruptSegment):
        decode_record(bytes(record))
    with pytest.raises(CorruptSegment):
        decode_record_key(bytes(record))


@given(records, st.data())
def test_a_record_cut_short_is_caught_by_its_key_too(fields: tuple, data: st.DataObject) -> None:
    record = encode_record(fields[0], fields[1], fields[2], fields[4], fields[3], fields[5])
    with pytest.raises(CorruptSegment):
        decode_record_key(record[:data.draw(st.integers(0, len(record) - 1))])


@given(st.data())
def test_any_flipped_bit_in_a_unit_is_caught(data: st.DataObject) -> None:
    unit = bytearray(pack_unit(123, 45, 6, 7, 5, 1_800_000_000_000, 3_599, 9))
    assert unpack_unit(bytes(unit)) == (123, 45, 6, 7, 5, 1_800_000_000_000, 3_599, 9)
    unit[data.draw(st.integers(0, len(unit) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    assert unpack_unit(bytes(unit)) is None


def test_heads_and_meta_round_trip_and_reject_damage() -> None:
    table = bytes(range(256)) * 112 + bytes(128)
    heads = pack_heads(table, 10, 999)
    units, log_size, got_table = unpack_heads(heads)
    assert (units, log_size, bytes(got_table)) == (10, 999, table)
    assert unpack_heads(heads[:-1]) is None
    assert unpack_heads(heads[:20] + b"\x00" + heads[21:]) is None
    assert unpack_meta(b"", "meta") is None


def test_meta_keeps_the_newest_valid_of_its_two_copies() -> None:
    older, newer = pack_meta(6, 1, 2, 3), pack_meta(7, 8, 9, 10)
    assert unpack_meta(older + newer, "meta") == (7, 8, 9, 10)
    assert unpack_meta(newer + older, "meta") == (7, 8, 9, 10)
    torn = newer[:-1] + bytes([newer[-1] ^ 1])
    assert unpack_meta(older + torn, "meta") == (6, 1, 2, 3)  # a torn write loses one step
    assert unpack_meta(older + newer[:10], "meta") == (6, 1, 2, 3)
    with pytest.raises(CorruptSegment):
        unpack_meta(torn + torn, "meta")
