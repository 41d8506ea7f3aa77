"""Damaged records, units and tombstones are mended from a copy, or held until one can be asked.

Two wheels fed the same calls write the same bytes, so each test builds one, copies its folder
(the "peer"), damages the original and opens it with the copy as its `CopySource`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tickwheel.common.errors import CorruptSegment
from tickwheel.wheel import NewMessage, Wheel
from tickwheel.wheel.format import TOMBSTONE, UNIT_SIZE

HOUR_MS = 3_600_000
NOW_MS = 1_000 * HOUR_MS
SEGMENT = Path("hours") / "00001000"


def msg(name: str, deliver_at_ms: int) -> NewMessage:
    return NewMessage(name, "t", name.encode() * 8, deliver_at_ms)


def take_all(wheel: Wheel, now_ms: int) -> list[str]:
    taken, batch = [], wheel.take_due(now_ms, 1_000)
    while batch:
        taken += [message.id for message in batch]
        batch = wheel.take_due(now_ms, 1_000)
    return taken


class Peers:
    """A `CopySource` over folders holding copies; a folder set to None cannot answer."""

    def __init__(self, *folders: Path | None) -> None:
        self.folders = list(folders)
        self.asked = 0

    def __call__(self, path: str, offset: int, size: int) -> Iterator[bytes | None]:
        self.asked += 1
        for folder in self.folders:
            if folder is None:
                yield None
                continue
            with open(folder / path, "rb") as file:
                data = os.pread(file.fileno(), size, offset)
            yield data if len(data) == size else None


@pytest.fixture
def stored(tmp_path: Path) -> tuple[Path, Path, list[int]]:
    """A wheel of 20 messages (due over 4 seconds, 3 cancelled) and an identical copy."""
    original = tmp_path / "node"
    with Wheel.open(original) as wheel:
        handles = wheel.schedule([msg(f"m{i:02}", NOW_MS + 200 * i) for i in range(20)],
                                 NOW_MS)
        for handle in handles[4:7]:
            wheel.cancel(handle)
    copy = tmp_path / "peer"
    shutil.copytree(original, copy)
    return original, copy, handles


EXPECTED = [f"m{i:02}" for i in range(20) if i not in (4, 5, 6)]


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def record_offset(root: Path, global_index: int) -> int:
    unit = (root / SEGMENT / "index").read_bytes()[global_index * UNIT_SIZE:]
    return int.from_bytes(unit[:8], "little")


def test_damaged_records_are_mended_from_a_copy_and_every_message_is_handed_out(
        stored: tuple[Path, Path, list[int]]) -> None:
    original, copy, _ = stored
    good = (copy / SEGMENT / "log").read_bytes()
    for global_index in (0, 9, 19):
        flip(original / SEGMENT / "log", record_offset(original, global_index) + 12)
    with Wheel.open(original, copies=Peers(copy)) as wheel:
        assert take_all(wheel, NOW_MS + 10_000) == EXPECTED
        assert (wheel.mended.records, wheel.corrupt_records_skipped) == (3, 0)
    assert (original / SEGMENT / "log").read_bytes() == good  # written back, not just read


def test_a_record_damaged_while_a_holder_cannot_answer_holds_the_take_until_it_can(
        stored: tuple[Path, Path, list[int]]) -> None:
    original, copy, _ = stored
    flip(original / SEGMENT / "log", record_offset(original, 9) + 12)
    peers = Peers(None, None)  # neither holder can answer, at first
    with Wheel.open(original, copies=peers) as wheel:
        first = take_all(wheel, NOW_MS + 10_000)
        assert first == [m for m in EXPECTED if m < "m09"]  # stops at the damage
        assert wheel.damage_held is not None and "no good copy" in wheel.damage_held
        assert wheel.corrupt_records_skipped == 0
        wheel.drain_skipped()
        peers.folders = [None, copy]  # the second one is back
        rest = take_all(wheel, NOW_MS + 10_000)
        assert rest == [m for m in EXPECTED if m >= "m09"]
        assert wheel.damage_held is None and wheel.mended.records == 1


def test_a_record_damaged_in_every_copy_is_skipped_and_counted(
        stored: tuple[Path, Path, list[int]]) -> None:
    original, copy, _ = stored
    for root in (original, copy):
        flip(root / SEGMENT / "log", record_offset(root, 9) + 12)
    with Wheel.open(original, copies=Peers(copy)) as wheel:
        assert take_all(wheel, NOW_MS + 10_000) == [m for m in EXPECTED if m != "m09"]
        assert wheel.corrupt_records_skipped == 1 and wheel.damage_held is None
        assert wheel.mended.unmended == 1


@pytest.mark.parametrize("clean_close", [True, False])
def test_a_damaged_index_unit_is_mended_at_open_and_in_a_chain_walk(
        stored: tuple[Path, Path, list[int]], clean_close: bool) -> None:
    """With a clean close the unit is first read walking its second's chain; without one
    (heads stale), replaying the index at open reads it. Both used to raise
    `CorruptSegment` on every try: a crash loop."""
    original, copy, _ = stored
    if not clean_close:
        (original / SEGMENT / "heads").unlink()
    flip(original / SEGMENT / "index", 7 * UNIT_SIZE + 20)
    with Wheel.open(original, copies=Peers(copy)) as wheel:
        assert take_all(wheel, NOW_MS + 10_000) == EXPECTED
        assert wheel.mended.units == 1
    assert (original / SEGMENT / "index").read_bytes() == (copy / SEGMENT / "index").read_bytes()


def test_a_damaged_unit_without_a_copy_still_fails_loudly(
        stored: tuple[Path, Path, list[int]]) -> None:
    original, _, _ = stored
    flip(original / SEGMENT / "index", 7 * UNIT_SIZE + 20)
    with Wheel.open(original) as wheel, pytest.raises(CorruptSegment):
        take_all(wheel, NOW_MS + 10_000)


def test_a_damaged_tombstone_is_mended_so_a_cancelled_message_stays_cancelled(
        stored: tuple[Path, Path, list[int]]) -> None:
    original, copy, _ = stored
    flip(original / SEGMENT / "tombstones", TOMBSTONE.size + 1)  # the middle one of three
    with Wheel.open(original, copies=Peers(copy)) as wheel:
        assert take_all(wheel, NOW_MS + 10_000) == EXPECTED
    assert ((original / SEGMENT / "tombstones").read_bytes()
            == (copy / SEGMENT / "tombstones").read_bytes())
