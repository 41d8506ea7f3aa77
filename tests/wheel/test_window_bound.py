"""The preload window holds at most ``max_window_msgs`` index units in memory, however messages
are filed into the seconds it has read, and a parked tag's late messages stay in the wheel;
every message still comes out once, when due, and each topic's in dispatch order where the
window read them in it."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tickwheel.wheel import DueMessage, NewMessage, Wheel, WheelConfig
from tickwheel.wheel.format import encode_record

NOW_MS = 1_000 * 3_600_000
"""On a second's start: a message due within 999 ms of it is due in the second being taken."""
BURST, STEADY = 1, 2
CONFIG = WheelConfig(max_load_units=2_000, max_window_msgs=5_000)
BATCH = 1_000
BURST_MSGS = 20_000


@contextmanager
def _wheel() -> Iterator[Wheel]:
    with tempfile.TemporaryDirectory() as root, Wheel.open(Path(root), CONFIG) as wheel:
        yield wheel


def _file(wheel: Wheel, tag: int, names: list[str], due_ms: int, stamp_ms: int) -> None:
    records = [encode_record(*NewMessage(name, f"t{tag}", b"x", due_ms, {})) for name in names]
    wheel.schedule_records(records, [due_ms] * len(names), stamp_ms, [tag] * len(names))


def _take_all(wheel: Wheel, now_ms: int, share_msgs: int) -> list[DueMessage]:
    taken: list[DueMessage] = []
    while batch := wheel.take_due(now_ms, 500, share_msgs):
        taken += batch
        assert wheel.window_msgs <= CONFIG.max_window_msgs + CONFIG.max_load_units
    return taken


def _quiet_wheel_read_ahead(wheel: Wheel) -> None:
    """A few steady messages due later; a take finds nothing due and reads ahead
    ``preload_ms``: the seconds up to theirs are read, so what is filed there is late."""
    for k in range(5):
        _file(wheel, STEADY, [f"s{k}"], NOW_MS + 3_000 + 100 * k, NOW_MS - 60_000)
    assert wheel.take_due(NOW_MS, 500) == []


@pytest.mark.parametrize("share_msgs", [0, 125])
def test_a_burst_due_in_the_second_being_taken_holds_at_most_max_window_msgs(
        share_msgs: int) -> None:
    """Filed under 1 s before it is due, a burst lands in the second the last take reached.
    Before: such filings went onto the queue whole (the window let go only of seconds after
    that take's), 20,000 here. Now what would fill the window past ``max_window_msgs`` is
    left in the wheel and read as a walk of its topic, as the dispatch takes it."""
    with _wheel() as wheel:
        _quiet_wheel_read_ahead(wheel)
        for start in range(0, BURST_MSGS, BATCH):
            _file(wheel, BURST, [f"b{start + i}" for i in range(BATCH)], NOW_MS + 900, NOW_MS)
            assert wheel.window_msgs <= CONFIG.max_window_msgs
        taken = _take_all(wheel, NOW_MS + 4_000, share_msgs)
    ids = [message.id for message in taken]
    assert len(ids) == len(set(ids)) == BURST_MSGS + 5
    assert [i for i in ids if i.startswith("s")] == [f"s{k}" for k in range(5)]


def test_takes_between_the_filings_keep_the_bound_and_miss_nothing() -> None:
    """The same burst with the dispatch taking between its batches, as a leader does: what
    is walked and what is queued both come out, once each, none before it is due."""
    with _wheel() as wheel:
        _quiet_wheel_read_ahead(wheel)
        taken: list[DueMessage] = []
        for start in range(0, BURST_MSGS, BATCH):
            _file(wheel, BURST, [f"b{start + i}" for i in range(BATCH)], NOW_MS + 900, NOW_MS)
            assert wheel.window_msgs <= CONFIG.max_window_msgs
            batch = wheel.take_due(NOW_MS + 950, 200, 50)
            assert len(batch) == 200 and all(m.id.startswith("b") for m in batch)
            taken += batch
        taken += _take_all(wheel, NOW_MS + 4_000, 125)
    ids = [message.id for message in taken]
    assert len(ids) == len(set(ids)) == BURST_MSGS + 5


@pytest.mark.parametrize("due_ms", [NOW_MS + 900, NOW_MS + 2_000])
def test_a_parked_topic_filed_late_stays_in_the_wheel(due_ms: int) -> None:
    """A parked topic's messages are passed over, in the wheel, not in memory. Before: those
    filed into seconds the window had read went onto its queue anyway (and aside at the next
    take), a message's entry each for as long as the topic stayed parked. Now each filing is
    a stretch of its second's chain, read once the topic is taken again."""
    with _wheel() as wheel:
        _quiet_wheel_read_ahead(wheel)
        wheel.park(frozenset({BURST}))
        for start in range(0, BURST_MSGS, BATCH):
            _file(wheel, BURST, [f"b{start + i}" for i in range(BATCH)], due_ms, NOW_MS)
            assert wheel.window_msgs == 5  # the steady messages read ahead
        assert wheel.take_due(NOW_MS + 950, 500, 125) == []
        assert [m.id for m in _take_all(wheel, NOW_MS + 4_000, 125)] == [
            f"s{k}" for k in range(5)]
        wheel.park(frozenset())
        taken = _take_all(wheel, NOW_MS + 4_000, 125)
    ids = [message.id for message in taken]
    assert len(ids) == len(set(ids)) == BURST_MSGS
