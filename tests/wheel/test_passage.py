"""The cursor's passage read ahead: the seconds it will pass are read over the turns before
it reaches them, and a whole second passed is counted from the counts kept as it was read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tickwheel.wheel import Cursor, NewMessage, Wheel
from tickwheel.wheel.format import encode_record
from tickwheel.wheel.passage import AHEAD_SECONDS
from tickwheel.wheel.segment import HourSegment

NOW_MS = 1_000 * 3_600_000


def msg(name: str, deliver_at_ms: int) -> NewMessage:
    return NewMessage(name, "t", b"x", deliver_at_ms, {})

def units_read_from_now_on(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The index units each chain walk reads from now on (`HourSegment.walk_chain`)."""
    read: list[int] = []
    walk_chain = HourSegment.walk_chain

    def counting(self: HourSegment, *args: Any) -> int:
        before = len(args[3])
        resume = walk_chain(self, *args)
        read.append(len(args[3]) - before)
        return resume

    monkeypatch.setattr(HourSegment, "walk_chain", counting)
    return read


def test_a_second_filed_into_after_it_was_read_ahead_is_read_again_ahead(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst scheduled into a second that was read ahead while it held a few messages: the
    cursor command entering it read every new unit at once, on every replica (a million in a
    burst: the leader's Raft thread stalled and it lost office)."""
    second = NOW_MS // 1_000 + 5
    with Wheel.open(tmp_path) as wheel:
        def file(count: int, start: int) -> None:
            batch = [msg(f"m{start + i}", second * 1_000) for i in range(count)]
            wheel.schedule_records([encode_record(*m) for m in batch],
                                   [m.deliver_at_ms for m in batch], NOW_MS, [1] * count)

        file(10, 0)
        wheel.walk_ahead(100)  # all ten read ahead
        file(2_000, 10)
        for _ in range(30):  # the turns between the burst's filing and the cursor's move
            wheel.walk_ahead(100)
        read_by_the_cursor = units_read_from_now_on(monkeypatch)
        assert wheel.live_tags_until(Cursor(second, 1_500)) == {1: 1_500}
        assert sum(read_by_the_cursor) == 0  # everything it passes was read ahead


def test_a_burst_second_beyond_the_next_is_read_ahead_before_the_cursor_enters_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A million due at one second, a few messages a second before it: only the next second
    the cursor would pass was read ahead, so the burst's second was read from one second
    before its time, too slowly, and the cursor command entering it read the rest at once on
    every replica (100-250 ms of a Raft thread that answers nothing meanwhile)."""
    second = NOW_MS // 1_000 + 5
    with Wheel.open(tmp_path) as wheel:
        def file(count: int, at_second: int, start: int) -> None:
            batch = [msg(f"m{start + i}", at_second * 1_000) for i in range(count)]
            wheel.schedule_records([encode_record(*m) for m in batch],
                                   [m.deliver_at_ms for m in batch], NOW_MS, [1] * count)

        for before in range(1, 5):  # the steady seconds before the burst's
            file(3, second - before, 10 * before)
        file(2_000, second + 1, 1_000)
        for _ in range(30):  # the turns before the burst's time
            wheel.walk_ahead(100)
        read_by_the_cursor = units_read_from_now_on(monkeypatch)
        assert wheel.live_tags_until(Cursor(second + 1, 1_500)) == {1: 1_512}
        assert sum(read_by_the_cursor) == 0  # everything it passes was read ahead



def test_a_second_due_beyond_the_reach_of_the_read_ahead_is_read_once_it_comes_within_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first second holding messages was read however far off it was, and read again from
    its start each time more than a step's units were filed into it: 200,000 messages
    scheduled two hours ahead were read again on the leader's Raft thread in the turns that
    followed, 2-4 ms a turn, which every schedule request waiting for those turns waited
    out too."""
    second = NOW_MS // 1_000 + AHEAD_SECONDS + 10
    with Wheel.open(tmp_path) as wheel:
        batch = [msg(f"m{i}", second * 1_000) for i in range(300)]
        wheel.schedule_records([encode_record(*m) for m in batch],
                               [m.deliver_at_ms for m in batch], NOW_MS, [1] * len(batch))
        read = units_read_from_now_on(monkeypatch)
        for _ in range(5):
            wheel.walk_ahead(100, NOW_MS)
        assert sum(read) == 0
        for _ in range(5):  # ten seconds later: within reach
            wheel.walk_ahead(100, NOW_MS + 10_000)
        assert sum(read) == 300
        read.clear()
        assert wheel.live_tags_until(Cursor(second, 300)) == {1: 300}
        assert sum(read) == 0  # everything the cursor passes was read ahead

def test_whole_seconds_passed_count_their_live_messages_as_a_pass_over_each_would(
        tmp_path: Path) -> None:
    """A cursor passing whole seconds counts them from the counts kept as they were read
    (a million tags counted at once held the Raft thread 40-90 ms); the cancelled ones are
    taken off, as the unit-by-unit count does, and a second filed into after it was read
    counts its new messages too."""
    first = NOW_MS // 1_000 + 5
    walked, direct = (Wheel.open(tmp_path / name) for name in ("a", "b"))
    handles: list[list[int]] = [[], []]
    for second in range(first, first + 3):
        batch = [msg(f"m{second}-{i}", second * 1_000 + i) for i in range(40)]
        for wheel, filed in zip((walked, direct), handles, strict=True):
            filed.extend(wheel.schedule_records([encode_record(*m) for m in batch],
                                                [m.deliver_at_ms for m in batch], NOW_MS,
                                                [1 + i % 3 for i in range(40)]))
    for _ in range(5):
        walked.walk_ahead(1_000)  # every second read ahead, its counts kept
    late = [msg("late", first * 1_000 + 500)]
    for wheel, filed in zip((walked, direct), handles, strict=True):
        filed.extend(wheel.schedule_records([encode_record(*m) for m in late], [late[0][3]],
                                            NOW_MS, [2]))
        for index in (0, 41, 42, 120):  # tags 1 and 2 of the first and second seconds
            wheel.handles.cancel_tag(filed[index])
    expected = {1: 14 * 3 - 1, 2: 13 * 3 + 1 - 2, 3: 13 * 3 - 1}
    cursor = Cursor(first + 3, 0)
    assert walked.live_tags_until(cursor) == direct.live_tags_until(cursor) == expected
    walked.close()
    direct.close()
