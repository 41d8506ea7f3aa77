"""A fair take: one tag's backlog, due before everything else, leaves room in every take for
the other tags' due messages, and a tag alone still gets whole takes."""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path

import pytest

from tickwheel.wheel import NewMessage, Wheel, WheelConfig
from tickwheel.wheel.format import encode_record

NOW_MS = 1_000 * 3_600_000
BURST, STEADY = 1, 2


@contextmanager
def _wheel(max_load_units: int) -> Iterator[Wheel]:
    with tempfile.TemporaryDirectory() as root, \
            Wheel.open(Path(root), WheelConfig(max_load_units=max_load_units)) as wheel:
        yield wheel


def _file(wheel: Wheel, tag: int, prefix: str, dues_ms: list[int]) -> None:
    records = [encode_record(*NewMessage(f"{prefix}{i}", prefix, b"x", due_ms, {}))
               for i, due_ms in enumerate(dues_ms)]
    wheel.schedule_records(records, dues_ms, NOW_MS - 60_000, [tag] * len(dues_ms))


@pytest.mark.parametrize("max_load_units", [10_000, 500])  # read at once, or walked
def test_a_backlog_leaves_each_take_room_for_the_other_topics(max_load_units: int) -> None:
    with _wheel(max_load_units) as wheel:
        _file(wheel, BURST, "burst", [NOW_MS] * 6_000)
        _file(wheel, STEADY, "steady", [NOW_MS + 100 * k for k in range(1, 9)])
        first = wheel.take_due(NOW_MS + 1_000, 1_000, share_msgs=250)
        tags = Counter(message.topic for message in first)
        # a take reads at most max_load_units units: the steady ones first, the burst after
        assert tags == {"steady": 8, "burst": min(1_000, max_load_units) - 8}, tags
        taken = {message.id for message in first}
        while batch := wheel.take_due(NOW_MS + 1_000, 1_000, share_msgs=250):
            assert all(message.topic == "burst" for message in batch)
            taken.update(message.id for message in batch)
        assert len(taken) == 6_008


def test_without_a_share_the_backlog_comes_first() -> None:
    """What a fair take changes: the same wheel, taken without a share."""
    with _wheel(10_000) as wheel:
        _file(wheel, BURST, "burst", [NOW_MS] * 6_000)
        _file(wheel, STEADY, "steady", [NOW_MS + 100 * k for k in range(1, 9)])
        first = wheel.take_due(NOW_MS + 1_000, 1_000)
        assert {message.topic for message in first} == {"burst"}


def test_many_small_topics_each_get_their_due_messages_in_the_first_take() -> None:
    with _wheel(10_000) as wheel:
        _file(wheel, BURST, "burst", [NOW_MS] * 5_000)
        for tag in range(2, 202):
            _file(wheel, tag, f"t{tag}-", [NOW_MS + 200, NOW_MS + 400])
        first = wheel.take_due(NOW_MS + 500, 1_000, share_msgs=250)
        small = Counter(message.topic for message in first if message.topic != "burst")
        assert len(small) == 200 and set(small.values()) == {2}
        assert len(first) == 1_000


def test_messages_not_yet_due_are_not_taken_for_fairness() -> None:
    with _wheel(10_000) as wheel:
        _file(wheel, BURST, "burst", [NOW_MS] * 2_000)
        _file(wheel, STEADY, "steady", [NOW_MS + 5_000])
        taken = wheel.take_due(NOW_MS + 1_000, 1_000, share_msgs=250)
        assert len(taken) == 1_000 and {m.topic for m in taken} == {"burst"}


def test_a_long_second_whose_messages_are_not_due_yet_is_not_read_take_after_take() -> None:
    """Before: from its second's start, every take (every dispatch step, and the steps of
    requests and acks) read another take's worth of a long second whose messages were due
    later in it, and the dispatch stepped at once again, until the window held
    max_window_msgs of them."""
    with _wheel(1_000) as wheel:
        _file(wheel, BURST, "burst", [NOW_MS + 600] * 20_000)
        for now_ms in range(NOW_MS, NOW_MS + 600, 5):
            assert wheel.take_due(now_ms, 1_000, share_msgs=250) == []
            assert wheel.window_msgs <= 1_000
        assert wheel.next_due_ms() == NOW_MS + 600  # not the second's start: no step at once
        assert len(wheel.take_due(NOW_MS + 600, 1_000, share_msgs=250)) == 1_000


def test_backlogs_take_turns_at_being_asked_first() -> None:
    """Two topics' backlogs and takes of one share each: the first backlog asked gets the
    take, and it changes from take to take. (It turned twice a take once, so with two
    backlogs the same one came first every time.)"""
    with _wheel(10_000) as wheel:
        _file(wheel, BURST, "a", [NOW_MS] * 2_000)
        _file(wheel, STEADY, "b", [NOW_MS] * 2_000)
        wheel.take_due(NOW_MS + 1_000, 1_000, share_msgs=10)  # both are backlogs now
        firsts = [wheel.take_due(NOW_MS + 1_000, 10, share_msgs=10)[0].topic
                  for _ in range(6)]
    assert sorted(firsts) == ["a"] * 3 + ["b"] * 3, firsts
    assert all(x != y for x, y in pairwise(firsts)), firsts


@pytest.mark.parametrize("max_load_units", [2_000, 4_000])
def test_messages_filed_before_a_burst_into_its_second_do_not_wait_for_the_burst(
        max_load_units: int) -> None:
    """A second's chain is read newest first, so the other topics' messages filed into the
    burst's second before the burst lie at the end of its chain. Before: the walk read on
    only as the burst's backlog was taken, and they went out after the whole burst. Now the
    walk of every tag passes over the backlog's units, at least half a take's reading
    (``max_load_units``) a take, and walks of the backlog's own read them as it is taken."""
    with _wheel(max_load_units) as wheel:
        _file(wheel, STEADY, "steady", [NOW_MS + 100 * k for k in range(1, 6)])
        _file(wheel, BURST, "burst", [NOW_MS] * 20_000)
        takes: list[list[str]] = []
        while batch := wheel.take_due(NOW_MS + 1_000, 500, share_msgs=125):
            takes.append([message.id for message in batch])
            assert wheel.window_msgs <= 2 * 500 + max_load_units
        ids = [msg_id for batch in takes for msg_id in batch]
        assert len(ids) == len(set(ids)) == 20_005
        steady_in = [n for n, batch in enumerate(takes) for msg_id in batch
                     if msg_id.startswith("steady")]
        assert len(steady_in) == 5
        assert max(steady_in) <= 20_000 // (max_load_units // 2) + 1, steady_in
        assert all(len(batch) == 500 for batch in takes[:-1])  # the burst drains at full takes


def test_a_burst_filed_into_the_seconds_the_window_holds_does_not_fill_memory() -> None:
    """Messages filed for a second the window has read already go straight onto its queue.
    Before: a burst filed a few seconds before it was due (the window of a quiet wheel reads
    ``preload_ms`` ahead) went there whole, past ``max_window_msgs``. Now the window lets go
    of what it loaded and reads again from the cursor, chain by chain."""
    config = WheelConfig(max_load_units=2_000, max_window_msgs=5_000)
    with tempfile.TemporaryDirectory() as root, Wheel.open(Path(root), config) as wheel:
        _file(wheel, STEADY, "steady", [NOW_MS + 3_000])
        assert wheel.take_due(NOW_MS, 500, share_msgs=125) == []  # read ahead: a quiet wheel
        for start in range(0, 20_000, 1_000):
            records = [encode_record(*NewMessage(f"burst{start + i}", "burst", b"x",
                                                 NOW_MS + 2_000, {})) for i in range(1_000)]
            wheel.schedule_records(records, [NOW_MS + 2_000] * 1_000, NOW_MS, [BURST] * 1_000)
            assert wheel.window_msgs <= config.max_window_msgs
        taken: list[str] = []
        while batch := wheel.take_due(NOW_MS + 3_000, 500, share_msgs=125):
            taken += [message.id for message in batch]
            assert wheel.window_msgs <= config.max_window_msgs + config.max_load_units
        assert len(taken) == len(set(taken)) == 20_001
