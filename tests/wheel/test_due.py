"""The due-time histogram (`tickwheel.wheel.due`) against a count made by hand: messages
scheduled over several hours, some cancelled, some passed by the cursor, with hours open in
memory and closed on disk (a wheel allowed two open hours), and after a reopen; the same for
the histogram of one tag (`tickwheel.wheel.tag_hours`)."""

from __future__ import annotations

import random
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tickwheel.wheel import Cursor, NewMessage, Wheel, WheelConfig
from tickwheel.wheel.format import encode_record

HOUR_S = 3_600
NOW_MS = 100 * HOUR_S * 1_000


def expected(due_seconds: dict[int, int], cursor_second: int, start: int, bucket_s: int,
             buckets: int) -> tuple[int, list[int], int]:
    """(overdue, counts, beyond) counted message by message."""
    counts, overdue, beyond = [0] * buckets, 0, 0
    end = start + bucket_s * buckets
    for second in due_seconds.values():
        if second < cursor_second:
            continue
        if second < start:
            overdue += 1
        elif second >= end:
            beyond += 1
        else:
            counts[(second - start) // bucket_s] += 1
    return overdue, counts, beyond


def check(wheel: Wheel, live: dict[int, int], cursor_second: int) -> None:
    for start, bucket_s, buckets in ((NOW_MS // 1_000 + 7, 1, 60), (NOW_MS // 1_000, 60, 60),
                                     (NOW_MS // 1_000 + 100, 3_600, 24),
                                     (NOW_MS // 1_000 - 5, 86_400, 365)):
        got = wheel.due_histogram(start, bucket_s, buckets)
        overdue, counts, beyond = expected(live, cursor_second, start, bucket_s, buckets)
        assert (got.overdue, list(got.counts), got.beyond) == (overdue, counts, beyond), (
            start, bucket_s)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_histogram_counts_every_live_message_once(tmp_path_factory: object, seed: int) -> None:
    root = Path(tmp_path_factory.mktemp("due"))  # type: ignore[attr-defined]
    rng = random.Random(seed)
    config = WheelConfig(max_open_hours=2)
    wheel = Wheel.open(root, config)
    live: dict[int, int] = {}
    for batch in range(4):
        delays_ms = [rng.choice([rng.randrange(0, 120_000), rng.randrange(0, 30 * HOUR_S * 1_000),
                                 rng.randrange(0, 300 * 24 * HOUR_S * 1_000)])
                     for _ in range(rng.randrange(1, 60))]
        handles = wheel.schedule([NewMessage(f"m{batch}-{i}", "t", b"x",
                                             deliver_at_ms=NOW_MS + delay)
                                  for i, delay in enumerate(delays_ms)], NOW_MS)
        live.update({h: (NOW_MS + d) // 1_000 for h, d in zip(handles, delays_ms, strict=True)})
        for handle in rng.sample(sorted(live), k=min(len(live), rng.randrange(0, 6))):
            wheel.cancel(handle)
            del live[handle]
        check(wheel, live, wheel.cursor.second)
    cursor_second = NOW_MS // 1_000 + 30
    wheel.advance_cursor(Cursor(cursor_second, 0))
    live = {h: s for h, s in live.items() if s >= cursor_second}
    check(wheel, live, cursor_second)
    wheel.close()
    reopened = Wheel.open(root, config)
    check(reopened, live, cursor_second)
    reopened.close()


def test_a_cancel_in_an_open_hour_shows_at_once(tmp_path: Path) -> None:
    wheel = Wheel.open(tmp_path)
    handle, = wheel.schedule([NewMessage("a", "t", b"x", deliver_at_ms=NOW_MS + 5_000)], NOW_MS)
    assert wheel.due_histogram(NOW_MS // 1_000, 1, 60).counts[5] == 1
    wheel.cancel(handle)
    assert wheel.due_histogram(NOW_MS // 1_000, 1, 60).counts[5] == 0
    wheel.close()


def check_tags(wheel: Wheel, live: dict[int, tuple[int, int]], cursor_second: int) -> None:
    """Each tag's histogram against the messages of that tag, counted one by one."""
    for tag in (0, 1, 2, 3, 9):
        check_one(wheel, {h: s for h, (s, t) in live.items() if t == tag}, cursor_second, tag)


def check_one(wheel: Wheel, live: dict[int, int], cursor_second: int, tag: int) -> None:
    for start, bucket_s, buckets in ((NOW_MS // 1_000 + 7, 1, 60), (NOW_MS // 1_000, 60, 60),
                                     (NOW_MS // 1_000 + 100, 3_600, 24),
                                     (NOW_MS // 1_000 - 5, 86_400, 365)):
        got = wheel.due_histogram(start, bucket_s, buckets, tag)
        overdue, counts, beyond = expected(live, cursor_second, start, bucket_s, buckets)
        assert (got.overdue, list(got.counts), got.beyond) == (overdue, counts, beyond), (
            tag, start, bucket_s)


def file_tagged(wheel: Wheel, rng: random.Random, batch: int
                ) -> dict[int, tuple[int, int]]:
    """A batch of messages of tags 0-3 spread over a minute, a day and most of a year, by
    the second each is filed under (not before the cursor's)."""
    delays_ms = [rng.choice([rng.randrange(0, 120_000), rng.randrange(0, 30 * HOUR_S * 1_000),
                             rng.randrange(0, 300 * 24 * HOUR_S * 1_000)])
                 for _ in range(rng.randrange(1, 60))]
    tags = [rng.randrange(0, 4) for _ in delays_ms]
    messages = [NewMessage(f"m{batch}-{i}", "t", b"x", deliver_at_ms=NOW_MS + delay)
                for i, delay in enumerate(delays_ms)]
    handles = wheel.schedule_records([encode_record(*m) for m in messages],
                                     [m.deliver_at_ms for m in messages], NOW_MS, tags)
    return {h: (max((NOW_MS + d) // 1_000, wheel.cursor.second), t)
            for h, d, t in zip(handles, delays_ms, tags, strict=True)}


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_histogram_of_one_tag_counts_its_live_messages_once(tmp_path_factory: object,
                                                             seed: int) -> None:
    """Schedule, cancel, reschedule (a cancel and a new filing), a tombstone of a message
    handed out, the cursor passing, hours closed on disk, a reopen: each tag's counts stay
    those of its own live messages."""
    root = Path(tmp_path_factory.mktemp("due-tags"))  # type: ignore[attr-defined]
    rng = random.Random(seed)
    config = WheelConfig(max_open_hours=2)
    wheel = Wheel.open(root, config)
    live: dict[int, tuple[int, int]] = {}
    for batch in range(4):
        live.update(file_tagged(wheel, rng, batch))
        for handle in rng.sample(sorted(live), k=min(len(live), rng.randrange(0, 6))):
            if rng.random() < 0.5:
                wheel.handles.cancel_tag(handle)
            else:
                wheel.handles.tombstone(handle)
            del live[handle]
        check_tags(wheel, live, wheel.cursor.second)
    cursor_second = NOW_MS // 1_000 + 30
    wheel.advance_cursor(Cursor(cursor_second, 0))
    live = {h: st for h, st in live.items() if st[0] >= cursor_second}
    check_tags(wheel, live, cursor_second)
    wheel.close()
    reopened = Wheel.open(root, config)
    check_tags(reopened, live, cursor_second)
    live.update(file_tagged(reopened, rng, 9))
    check_tags(reopened, live, cursor_second)
    reopened.close()


def test_a_cancelled_message_leaves_its_tag_alone(tmp_path: Path) -> None:
    wheel = Wheel.open(tmp_path)
    messages = [NewMessage(f"{i}", "t", b"x", deliver_at_ms=NOW_MS + 5_000) for i in range(3)]
    handles = wheel.schedule_records([encode_record(*m) for m in messages],
                                     [NOW_MS + 5_000] * 3, NOW_MS, [1, 2, 2])
    assert [wheel.due_histogram(NOW_MS // 1_000, 1, 60, tag).counts[5]
            for tag in (1, 2, 3)] == [1, 2, 0]
    wheel.cancel(handles[1])
    assert [wheel.due_histogram(NOW_MS // 1_000, 1, 60, tag).counts[5]
            for tag in (1, 2, 3)] == [1, 1, 0]
    assert [wheel.due_histogram(NOW_MS // 1_000, 3_600, 24, tag).counts[0]
            for tag in (1, 2, 3)] == [1, 1, 0]
    wheel.close()


def test_one_tag_leaves_out_what_the_cursor_passed_in_its_second(tmp_path: Path) -> None:
    """Every topic together counts the cursor's whole second; one tag's, only what the
    cursor has not passed in it."""
    wheel = Wheel.open(tmp_path)
    second = NOW_MS // 1_000 + 5
    messages = [NewMessage(f"{i}", "t", b"x", deliver_at_ms=second * 1_000) for i in range(4)]
    wheel.schedule_records([encode_record(*m) for m in messages], [second * 1_000] * 4, NOW_MS,
                           [1, 1, 2, 1])
    wheel.advance_cursor(Cursor(second, 3))  # passed: two of tag 1, the one of tag 2
    for start, bucket_s, buckets in ((second, 1, 60), (NOW_MS // 1_000, 3_600, 24)):
        assert wheel.due_histogram(start, bucket_s, buckets).counts[0] == 4
        assert [wheel.due_histogram(start, bucket_s, buckets, tag).counts[0]
                for tag in (1, 2)] == [1, 0]
    wheel.close()
