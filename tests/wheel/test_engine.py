"""Unit tests of the wheel engine: one rule each."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tickwheel.wheel import (
    CancelResult,
    CorruptSegment,
    Cursor,
    InvalidMessage,
    InvariantViolation,
    NewMessage,
    StorageLocked,
    UnknownHandle,
    Wheel,
    WheelConfig,
    repair,
)
from tickwheel.wheel.format import UNIT, UNIT_SIZE, encode_record, pack_unit
from tickwheel.wheel.types import DAY_MS

HOUR_MS = 3_600_000
NOW_MS = 1_000 * HOUR_MS  # hour 1000, second 3_600_000


def msg(name: str, deliver_at_ms: int, body: bytes = b"x", **properties: str) -> NewMessage:
    return NewMessage(name, "orders", body, deliver_at_ms, properties)


def take_all(wheel: Wheel, now_ms: int) -> list:
    taken, batch = [], wheel.take_due(now_ms, 1_000)
    while batch:
        taken += batch
        batch = wheel.take_due(now_ms, 1_000)
    return taken


@pytest.fixture
def wheel(tmp_path: Path):
    with Wheel.open(tmp_path / "w") as opened:
        yield opened


def test_a_second_is_a_chain_newest_first_and_insert_never_sorts(tmp_path: Path) -> None:
    with Wheel.open(tmp_path) as wheel:
        wheel.schedule([msg(f"m{i}", NOW_MS + 5_000 + i) for i in range(4)], NOW_MS)
    index = (tmp_path / "hours" / "00001000" / "index").read_bytes()
    units = [UNIT.unpack_from(index, i * UNIT_SIZE) for i in range(len(index) // UNIT_SIZE)]
    # (local_index, global_index, pre_global_index) in append order
    assert [(u[2], u[3], u[4]) for u in units] == [(0, 0, -1), (1, 1, 0), (2, 2, 1), (3, 3, 2)]
    assert {u[6] for u in units} == {5}  # all filed under second 5 of the hour


def test_within_a_second_messages_go_out_in_millisecond_order(wheel: Wheel) -> None:
    wheel.schedule([msg("late", NOW_MS + 1_900), msg("early", NOW_MS + 1_100),
                    msg("mid", NOW_MS + 1_500)], NOW_MS)
    assert [m.id for m in wheel.take_due(NOW_MS + 1_600, 10)] == ["early", "mid"]
    assert [m.id for m in wheel.take_due(NOW_MS + 1_900, 10)] == ["late"]


def test_next_due_jumps_empty_time_and_an_earlier_arrival_changes_it(wheel: Wheel) -> None:
    far_ms = NOW_MS + 200 * DAY_MS + 123
    wheel.schedule([msg("far", far_ms)], NOW_MS)
    assert wheel.next_due_ms() == far_ms // 1_000 * 1_000
    assert wheel.take_due(NOW_MS + 60_000, 10) == []
    wheel.schedule([msg("soon", NOW_MS + 30_000)], NOW_MS)
    assert wheel.next_due_ms() == NOW_MS + 30_000
    assert [m.id for m in wheel.take_due(far_ms, 10)] == ["soon", "far"]
    assert wheel.next_due_ms() is None


def test_any_delay_up_to_the_maximum_is_accepted_and_beyond_it_names_the_field(
        wheel: Wheel) -> None:
    last_ms = NOW_MS + 366 * DAY_MS
    [handle] = wheel.schedule([msg("year", last_ms)], NOW_MS)
    assert handle >> 32 == last_ms // HOUR_MS
    with pytest.raises(InvalidMessage) as error:
        wheel.schedule([msg("ok", NOW_MS), msg("too-far", last_ms + 1)], NOW_MS)
    assert error.value.field == "deliver_at_ms"
    assert [m.id for m in take_all(wheel, last_ms)] == ["year"]  # "ok" was not half-written


def test_limits_that_the_format_imposes_name_their_field(wheel: Wheel) -> None:
    with pytest.raises(InvalidMessage) as error:
        wheel.schedule([msg("x" * 70_000, NOW_MS)], NOW_MS)
    assert error.value.field == "id"
    with pytest.raises(InvalidMessage) as error:
        wheel.schedule([msg("neg", -1)], NOW_MS)
    assert error.value.field == "deliver_at_ms"


def test_properties_and_unicode_survive_a_round_trip(tmp_path: Path) -> None:
    with Wheel.open(tmp_path) as wheel:
        wheel.schedule([NewMessage("é-1", "tópico", b"\x00body", NOW_MS,
                                   {"trace": "ä", "": ""})], NOW_MS)
    with Wheel.open(tmp_path) as wheel:
        [got] = wheel.take_due(NOW_MS, 10)
    assert (got.id, got.topic, got.body, dict(got.properties)) == (
        "é-1", "tópico", b"\x00body", {"trace": "ä", "": ""})


def test_an_overdue_message_is_filed_at_the_cursor_never_behind_it(wheel: Wheel) -> None:
    wheel.schedule([msg(f"m{i}", NOW_MS) for i in range(3)], NOW_MS)
    taken = wheel.take_due(NOW_MS, 10)
    wheel.advance_cursor(Cursor(taken[-1].slot_second, 2))  # m0, m1 done; m2 in flight
    [handle] = wheel.schedule([msg("overdue", NOW_MS - 5 * HOUR_MS)], NOW_MS - 9 * HOUR_MS)
    wheel.rewind()
    again = wheel.take_due(NOW_MS, 10)
    # Both in the cursor's second, after its local_index; within a second, earliest due first.
    assert [(m.id, m.position) for m in again] == [("overdue", (NOW_MS // 1000, 3)),
                                                   ("m2", (NOW_MS // 1000, 2))]
    assert again[0].handle == handle


def test_the_cursor_never_moves_backwards(wheel: Wheel) -> None:
    wheel.advance_cursor(Cursor(100, 5))
    with pytest.raises(InvariantViolation):
        wheel.advance_cursor(Cursor(100, 4))


def test_passed_hours_stay_until_their_owner_deletes_them(tmp_path: Path) -> None:
    with Wheel.open(tmp_path) as wheel:
        wheel.schedule([msg("a", NOW_MS + 10), msg("b", NOW_MS + HOUR_MS + 10)], NOW_MS)
        wheel.flush()
        assert wheel.hours == [1000, 1001]
        wheel.advance_cursor(Cursor(1001 * 3600 - 1, 0))  # still inside hour 1000
        assert wheel.passed_hours() == []
        with pytest.raises(InvariantViolation):
            wheel.delete_hour(1000)
        wheel.advance_cursor(Cursor(1001 * 3600, 0))
        assert wheel.passed_hours() == [1000]  # a snapshot may still name it
        assert (tmp_path / "hours" / "00001000").exists()
    with Wheel.open(tmp_path) as wheel:  # nor does reopening delete it
        assert wheel.passed_hours() == [1000]
        wheel.delete_hour(1000)
        assert wheel.hours == [1001] and wheel.passed_hours() == []
        assert not (tmp_path / "hours" / "00001000").exists()


def test_cancel_tombstones_once_and_never_returns_the_message(tmp_path: Path) -> None:
    with Wheel.open(tmp_path) as wheel:
        keep, drop = wheel.schedule([msg("keep", NOW_MS + 10), msg("drop", NOW_MS + 20)],
                                    NOW_MS)
        assert wheel.cancel(drop) is CancelResult.CANCELLED
        assert wheel.cancel(drop) is CancelResult.ALREADY_CANCELLED
        with pytest.raises(UnknownHandle) as error:
            wheel.cancel(drop + 1_000)
        assert error.value.field == "handle"
    with Wheel.open(tmp_path) as wheel:
        assert [m.id for m in take_all(wheel, NOW_MS + 1_000)] == ["keep"]
        wheel.advance_cursor(Cursor(NOW_MS // 1000 + 1, 0))
        assert wheel.cancel(keep) is CancelResult.NOT_PENDING  # behind the cursor: done
        assert wheel.cancel(drop) is CancelResult.ALREADY_CANCELLED  # its hour is still kept
        wheel.advance_cursor(Cursor(NOW_MS // 1000 + 2 * 3600, 0))
        assert wheel.cancel(drop) is CancelResult.NOT_PENDING  # its hour is deleted


def test_cancelling_a_message_in_flight_keeps_it_from_being_handed_out_again(
        wheel: Wheel) -> None:
    [handle] = wheel.schedule([msg("a", NOW_MS)], NOW_MS)
    assert [m.id for m in wheel.take_due(NOW_MS, 10)] == ["a"]
    assert wheel.cancel(handle) is CancelResult.CANCELLED
    wheel.rewind()
    assert wheel.take_due(NOW_MS, 10) == []


def _drive(root: Path) -> None:
    with Wheel.open(root, WheelConfig(max_buffered_bytes=300, max_open_hours=2)) as wheel:
        handles = []
        for step in range(30):
            now_ms = NOW_MS + step * 1_000
            handles += wheel.schedule([msg(f"m{step}-{i}", now_ms + (i * 7_919 % 11) * HOUR_MS
                                           // 3) for i in range(5)], now_ms)
            if step % 4 == 0:
                wheel.cancel(handles[step])
            taken = wheel.take_due(now_ms, 3)
            if taken:
                wheel.advance_cursor(Cursor(taken[-1].slot_second, 0))


def test_two_engines_fed_the_same_commands_write_identical_bytes(tmp_path: Path) -> None:
    _drive(tmp_path / "a")
    _drive(tmp_path / "b")
    files_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*")
                     if p.is_file())
    files_b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*")
                     if p.is_file())
    assert files_a == files_b and len(files_a) > 10
    for relative in files_a:
        assert (tmp_path / "a" / relative).read_bytes() == (tmp_path / "b" / relative).read_bytes()


def test_reopen_after_a_clean_close_reads_heads_and_never_replays_the_index(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Wheel.open(tmp_path) as wheel:
        wheel.schedule([msg(f"m{i}", NOW_MS + i * 60_000) for i in range(500)], NOW_MS)

    def no_replay(*args: object) -> None:
        raise AssertionError("reopen replayed the index")

    monkeypatch.setattr(repair, "_replay", no_replay)
    with Wheel.open(tmp_path) as wheel:
        assert wheel.next_due_ms() == NOW_MS
        assert len(take_all(wheel, NOW_MS + 500 * 60_000)) == 500


def test_damaged_heads_are_rebuilt_from_the_index(tmp_path: Path) -> None:
    with Wheel.open(tmp_path) as wheel:
        wheel.schedule([msg(f"m{i}", NOW_MS + i * 1_000) for i in range(50)], NOW_MS)
    heads = tmp_path / "hours" / "00001000" / "heads"
    heads.write_bytes(b"\xff" * heads.stat().st_size)
    with Wheel.open(tmp_path) as wheel:
        assert [m.id for m in take_all(wheel, NOW_MS + 50_000)] == [f"m{i}" for i in range(50)]


def test_a_torn_write_at_any_byte_keeps_every_whole_record(tmp_path: Path) -> None:
    original = tmp_path / "original"
    with Wheel.open(original) as wheel:
        handles = wheel.schedule([msg(f"m{i}", NOW_MS + i, body=bytes([i]) * i)
                                  for i in range(4)], NOW_MS)
        wheel.cancel(handles[1])
    folder = original / "hours" / "00001000"
    for name in ("log", "index", "heads", "tombstones"):
        size = (folder / name).stat().st_size
        # every byte, but only a stride through the 28.8 KiB heads table after its header
        cuts = range(size) if name != "heads" else [*range(64), *range(64, size, 499)]
        for cut in cuts:
            copy = tmp_path / f"{name}-{cut}"
            shutil.copytree(original, copy)
            with open(copy / "hours" / "00001000" / name, "r+b") as file:
                file.truncate(cut)
            with Wheel.open(copy) as wheel:
                got = [(m.id, m.body) for m in take_all(wheel, NOW_MS + 10)]
                assert wheel.corrupt_records_skipped == 0
            expected = [(f"m{i}", bytes([i]) * i) for i in range(4)]
            if name != "tombstones":
                expected.remove(("m1", b"\x01"))
            assert got == expected[:len(got)], (name, cut)  # a prefix, byte for byte
            if name in ("heads", "tombstones"):
                assert len(got) == len(expected), (name, cut)
            shutil.rmtree(copy)


def test_a_damaged_record_is_skipped_and_counted_never_returned(tmp_path: Path) -> None:
    with Wheel.open(tmp_path) as wheel:
        wheel.schedule([msg("a", NOW_MS, b"A" * 20), msg("b", NOW_MS, b"B" * 20)], NOW_MS)
    log_path = tmp_path / "hours" / "00001000" / "log"
    data = bytearray(log_path.read_bytes())
    data[data.index(b"A" * 20) + 3] ^= 0x01
    log_path.write_bytes(bytes(data))
    with Wheel.open(tmp_path) as wheel:
        assert [m.id for m in take_all(wheel, NOW_MS)] == ["b"]
        assert wheel.corrupt_records_skipped == 1


def test_a_second_process_cannot_open_the_same_folder(tmp_path: Path) -> None:
    with Wheel.open(tmp_path), pytest.raises(StorageLocked):
        Wheel.open(tmp_path)


def test_a_damaged_meta_stops_the_open_loudly_and_leaves_the_folder_usable(
        tmp_path: Path) -> None:
    with Wheel.open(tmp_path) as wheel:
        wheel.advance_cursor(Cursor(5, 0))
    (tmp_path / "meta").write_bytes(b"\x00" * 64)
    with pytest.raises(CorruptSegment):
        Wheel.open(tmp_path)
    (tmp_path / "meta").unlink()  # the lock was released: an operator can repair and retry
    with Wheel.open(tmp_path) as wheel:
        assert wheel.cursor == (0, 0)


def test_the_preload_window_stays_bounded(tmp_path: Path) -> None:
    config = WheelConfig(max_window_msgs=50, preload_ms=3_600_000)
    with Wheel.open(tmp_path, config) as wheel:
        wheel.schedule([msg(f"m{i}", NOW_MS + i * 10) for i in range(2_000)], NOW_MS)
        seen = 0
        while batch := wheel.take_due(NOW_MS + 3_600_000, 7):
            seen += len(batch)
            assert wheel.window_msgs <= 50 + 100  # the cap plus one second loaded whole
        assert seen == 2_000


def test_live_tags_until_counts_each_passed_uncancelled_message_once(tmp_path: Path) -> None:
    wheel = Wheel.open(tmp_path)
    second = NOW_MS // 1_000
    batch = [msg(f"m{i}", NOW_MS + 1_000 * (i % 2)) for i in range(6)]
    handles = wheel.schedule_records([encode_record(*m) for m in batch],
                                     [m.deliver_at_ms for m in batch], NOW_MS, [1, 2, 3, 1, 2, 3])
    assert wheel.handles.cancel_tag(handles[2]) == (CancelResult.CANCELLED, 3)
    assert wheel.handles.cancel_tag(handles[2]) == (CancelResult.ALREADY_CANCELLED, 0)
    assert wheel.live_tags_until(Cursor(second, 2)) == {1: 1}  # m0, m2 (cancelled)
    wheel.advance_cursor(Cursor(second, 2))
    late = wheel.schedule_records([encode_record(*msg("late", 0))], [0], NOW_MS, [7])
    assert late  # filed under the cursor's second, after what the cursor passed
    assert wheel.live_tags_until(Cursor(second + 1, 1)) == {2: 2, 7: 1}  # m4 late m1
    assert wheel.live_tags_until(Cursor(second + 5, 0)) == {2: 2, 7: 1, 1: 1, 3: 1}
    wheel.close()


def test_a_batch_across_hours_writes_the_units_pack_unit_makes(tmp_path: Path) -> None:
    # The batch path packs units in one loop; the reference encoder says what they must be.
    due_ms = [NOW_MS + 5_000, NOW_MS + 5_500, NOW_MS + HOUR_MS + 1_000, NOW_MS + 6_000,
              NOW_MS + 5_900]
    records = [encode_record(*msg(f"m{i}", due)) for i, due in enumerate(due_ms)]
    tags = [11, 12, 13, 14, 15]
    with Wheel.open(tmp_path) as wheel:
        handles = wheel.schedule_records(records, due_ms, NOW_MS, tags)
        assert [wheel.handles.cancel_tag(handle) for handle in handles] == [
            (CancelResult.CANCELLED, tag) for tag in tags]
    sizes = [len(record) for record in records]
    # hour 1000 holds m0, m1, m3, m4 (seconds 5, 5, 6, 5); hour 1001 holds m2 (second 1)
    expected = {"00001000": [pack_unit(0, sizes[0], 0, 0, -1, due_ms[0], 5, 11),
                             pack_unit(sizes[0], sizes[1], 1, 1, 0, due_ms[1], 5, 12),
                             pack_unit(sum(sizes[:2]), sizes[3], 0, 2, -1, due_ms[3], 6, 14),
                             pack_unit(sum(sizes[:2]) + sizes[3], sizes[4], 2, 3, 1, due_ms[4],
                                       5, 15)],
                "00001001": [pack_unit(0, sizes[2], 0, 0, -1, due_ms[2], 1, 13)]}
    for hour, units in expected.items():
        assert (tmp_path / "hours" / hour / "index").read_bytes() == b"".join(units)
    assert (tmp_path / "hours" / "00001000" / "log").read_bytes() == b"".join(
        records[i] for i in (0, 1, 3, 4))


def test_walking_ahead_in_steps_changes_no_count_the_cursor_takes(tmp_path: Path) -> None:
    # walk_ahead reads the next second's chain a few units at a time, while messages are
    # still filed there and some are cancelled; the counts must be those of a wheel that
    # read nothing ahead.
    second = NOW_MS // 1_000 + 5
    walked, direct = (Wheel.open(tmp_path / name) for name in ("a", "b"))
    tags: list[int] = []
    handles: list[list[int]] = [[], []]

    def file(count: int, tag: int) -> None:
        batch = [msg(f"m{len(tags) + i}", second * 1_000 + i) for i in range(count)]
        for wheel, filed in zip((walked, direct), handles, strict=True):
            filed.extend(wheel.schedule_records([encode_record(*m) for m in batch],
                                                [m.deliver_at_ms for m in batch], NOW_MS,
                                                [tag] * count))
        tags.extend([tag] * count)

    def cancel(local_index: int) -> None:
        for wheel, filed in zip((walked, direct), handles, strict=True):
            assert wheel.handles.cancel_tag(filed[local_index])[0] is CancelResult.CANCELLED
        tags[local_index] = 0

    file(50, 1)
    walked.walk_ahead(7)
    file(10, 2)  # filed under the second while it is being read
    cancel(3)  # in the part read so far
    walked.walk_ahead(7)
    walked.walk_ahead(1_000)  # the rest of what was there when the walk began
    file(5, 3)  # filed after the walk
    cancel(55)
    cancel(62)

    def expected(start: int, stop: int) -> dict[int, int]:
        counts: dict[int, int] = {}
        for tag in tags[start:stop]:
            if tag:
                counts[tag] = counts.get(tag, 0) + 1
        return counts

    for cursor, start in ((Cursor(second, 30), 0), (Cursor(second + 1, 0), 30)):
        assert walked.live_tags_until(cursor) == direct.live_tags_until(cursor) == expected(
            start, cursor.local_index if cursor.second == second else len(tags))
        for wheel in (walked, direct):
            wheel.advance_cursor(cursor)
    walked.close()
    direct.close()


def take_sized(wheel: Wheel, now_ms: int, max_msgs: int = 1_000) -> tuple[list, list[int]]:
    """Every due message, take after take until one hands out nothing; and how many each
    take handed out."""
    taken, sizes = [], []
    while batch := wheel.take_due(now_ms, max_msgs):
        taken += batch
        sizes.append(len(batch))
    return taken, sizes


def test_a_second_larger_than_a_take_may_read_goes_out_as_it_is_read_and_holds_back_nothing(
        tmp_path: Path) -> None:
    """A million messages due in one second were read in one take, on the Raft thread: for
    seconds no heartbeat went out, a follower won an election, and every new leader read the
    second again. Then it was read over several takes but went onto the queue whole: a
    million units in memory, and every message due after them waited until they were all
    read. Now a take reads at most max_load_units of the chain and hands out what it read,
    and the next seconds load beside it."""
    config = WheelConfig(max_load_units=100)
    with Wheel.open(tmp_path, config) as wheel:
        dues = [NOW_MS + 5_000 + (i * 7_919) % 1_000 for i in range(1_050)]  # one second
        wheel.schedule([msg(f"m{i}", due) for i, due in enumerate(dues)], NOW_MS)
        wheel.schedule([msg("after", NOW_MS + 6_100)], NOW_MS)
        first = wheel.take_due(NOW_MS + 6_500, 1_000)
        assert wheel.window_msgs == 0 and wheel.walking == 1
        taken, sizes = take_sized(wheel, NOW_MS + 6_500)
        taken = first + taken
    assert max(sizes) <= 100  # never more than a take may read
    assert sorted(m.id for m in taken) == sorted(["after", *(f"m{i}" for i in range(1_050))])
    assert [m.id for m in taken].index("after") < 200  # not behind the whole long second
    assert {m.id for m in first} == {f"m{i}" for i in range(950, 1_050)}  # newest first


@pytest.mark.timeout(20)
def test_a_short_second_that_does_not_fit_what_is_left_of_a_take_is_read_whole_after(
        tmp_path: Path) -> None:
    with Wheel.open(tmp_path, WheelConfig(max_load_units=10)) as wheel:
        for second in (5, 6):
            wheel.schedule([msg(f"s{second}-{i}", NOW_MS + second * 1_000 + 999 - i)
                            for i in range(6)], NOW_MS)
        taken = wheel.take_due(NOW_MS + 7_000, 100)  # looped forever once: neither read it
    assert [m.id for m in taken] == [f"s{second}-{i}" for second in (5, 6)  # nor went on
                                     for i in reversed(range(6))]  # each second whole, by due


def test_what_is_filed_or_cancelled_in_a_second_while_it_loads_is_not_lost_nor_sent(
        tmp_path: Path) -> None:
    config = WheelConfig(max_load_units=100)
    with Wheel.open(tmp_path, config) as wheel:
        handles = wheel.schedule([msg(f"m{i}", NOW_MS + 5_500) for i in range(500)], NOW_MS)
        first = wheel.take_due(NOW_MS + 6_000, 1_000)  # 100 of 500 units read
        assert len(first) == 100 and wheel.walking == 1
        assert wheel.next_due_ms() == NOW_MS + 5_000  # what is not read yet may be due then
        wheel.schedule([msg("late", NOW_MS + 5_100)], NOW_MS)  # ahead of the chain's walk
        wheel.cancel(handles[0])  # not read yet (the chain goes newest first)
        rest, _ = take_sized(wheel, NOW_MS + 6_000)
        taken = first + rest
        assert rest[0].id == "late" and wheel.walking == 0
        assert sorted(m.id for m in taken) == sorted(["late", *(f"m{i}" for i in range(1, 500))])
        wheel.rewind()  # a new leader's pass from the cursor (not moved): all again, once
        again, _ = take_sized(wheel, NOW_MS + 6_000)
        assert sorted(m.id for m in again) == sorted(m.id for m in taken)


def schedule_tagged(wheel: Wheel, tag: int, names: list[str], due_ms: int) -> list[int]:
    records = [encode_record(*msg(name, due_ms)) for name in names]
    return wheel.schedule_records(records, [due_ms] * len(names), NOW_MS, [tag] * len(names))


@pytest.mark.parametrize("max_load_units", [10_000, 100])
def test_a_parked_tag_waits_in_the_wheel_and_the_others_go_on(tmp_path: Path,
                                                             max_load_units: int) -> None:
    """A topic whose consumers are behind is parked: its messages stay in the wheel, not in
    memory; the other topics' messages, due with them or after, are taken meanwhile; once it
    is taken again its messages come, each once. Both ways a second is read: whole and as a
    walk of a long chain."""
    with Wheel.open(tmp_path, WheelConfig(max_load_units=max_load_units)) as wheel:
        burst = schedule_tagged(wheel, 7, [f"b{i}" for i in range(600)], NOW_MS + 5_000)
        schedule_tagged(wheel, 3, [f"s{i}" for i in range(20)], NOW_MS + 5_000)
        schedule_tagged(wheel, 3, [f"t{i}" for i in range(20)], NOW_MS + 6_000)
        taken = wheel.take_due(NOW_MS + 7_000, 50)  # read before the tag is parked
        wheel.park(frozenset({7}))
        more, _ = take_sized(wheel, NOW_MS + 7_000, 50)
        others = {m.id for m in more}
        assert {f"s{i}" for i in range(20)} | {f"t{i}" for i in range(20)} <= {
            m.id for m in taken + more}
        assert not any(name.startswith("b") for name in others)  # parked: none taken
        assert wheel.window_msgs == 0  # what was loaded before waits aside
        assert wheel.drain_skipped() == []  # parked is not skipped: no cursor passes it
        victim = next(i for i in range(600) if f"b{i}" not in {m.id for m in taken})
        wheel.cancel(burst[victim])  # cancelled while parked: never taken
        wheel.park(frozenset())
        rest, _ = take_sized(wheel, NOW_MS + 7_000, 50)
        ids = [m.id for m in taken + more + rest]
    assert sorted(ids) == sorted([*(f"b{i}" for i in range(600) if i != victim),
                                  *(f"s{i}" for i in range(20)), *(f"t{i}" for i in range(20))])
    assert len(ids) == len(set(ids))


def test_a_tag_parked_again_part_way_through_its_walk_goes_on_from_there(
        tmp_path: Path) -> None:
    """Parked and taken again every few takes, as a burst is paced by its consumers: every
    message is taken once, and the chain is not read again from its start each time."""
    with Wheel.open(tmp_path, WheelConfig(max_load_units=100)) as wheel:
        schedule_tagged(wheel, 7, [f"b{i}" for i in range(1_000)], NOW_MS + 5_000)
        wheel.park(frozenset({7}))
        assert take_sized(wheel, NOW_MS + 7_000, 50)[0] == []
        ids: list[str] = []
        for _ in range(400):
            wheel.park(frozenset())
            ids += [m.id for m in wheel.take_due(NOW_MS + 7_000, 50)]
            wheel.park(frozenset({7}))
            ids += [m.id for m in wheel.take_due(NOW_MS + 7_000, 50)]
            if len(ids) == 1_000:
                break
    assert sorted(ids) == sorted(f"b{i}" for i in range(1_000))
    assert len(ids) == len(set(ids))
