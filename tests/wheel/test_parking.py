"""Parked tags, attacked with random schedules: whatever the order of parking, taking again,
cancelling, filing late and rewinding, with fair shares per tag or without, every message
is taken exactly once per pass, none while its tag is parked, none cancelled before it was
taken, and no position is reported skipped that was not cancelled."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tickwheel.wheel import NewMessage, Wheel, WheelConfig
from tickwheel.wheel.format import encode_record

NOW_MS = 1_000 * 3_600_000
TAGS = (1, 2, 3)

operations = st.lists(st.one_of(
    st.tuples(st.just("park"), st.frozensets(st.sampled_from(TAGS))),
    st.tuples(st.just("take"), st.integers(1, 40)),
    st.tuples(st.just("file"), st.sampled_from(TAGS), st.integers(1, 30),
              st.integers(0, 3_000)),
    st.tuples(st.just("cancel"), st.integers(0, 10_000)),
), max_size=60)


@settings(max_examples=60, deadline=None)
@given(first=st.lists(st.tuples(st.sampled_from(TAGS), st.integers(0, 2_500)),
                      min_size=1, max_size=400),
       steps=operations, max_load_units=st.sampled_from([7, 50, 10_000]),
       rewind_at=st.one_of(st.none(), st.integers(0, 60)),
       share_msgs=st.sampled_from([0, 1, 3]))
def test_every_message_is_taken_once_and_never_while_its_tag_is_parked(
        first: list[tuple[int, int]], steps: list[tuple], max_load_units: int,
        rewind_at: int | None, share_msgs: int) -> None:
    with tempfile.TemporaryDirectory() as root, \
            Wheel.open(Path(root), WheelConfig(max_load_units=max_load_units,
                                               max_window_msgs=60)) as wheel:
        tag_of: dict[str, int] = {}
        handles: dict[int, str] = {}

        def file(tag_and_delay: list[tuple[int, int]], stamp_ms: int) -> None:
            names = [f"m{len(tag_of) + i}" for i in range(len(tag_and_delay))]
            dues = [NOW_MS + delay for _, delay in tag_and_delay]
            records = [encode_record(*NewMessage(name, "t", b"x", due, {}))
                       for name, due in zip(names, dues, strict=True)]
            tags = [tag for tag, _ in tag_and_delay]
            filed = wheel.schedule_records(records, dues, stamp_ms, tags)
            for name, tag, handle in zip(names, tags, filed, strict=True):
                tag_of[name] = tag
                handles[handle] = name

        file(first, NOW_MS - 10_000)
        now_ms = NOW_MS + 3_000  # everything filed so far is due
        taken: set[str] = set()
        cancelled: set[str] = set()

        def take(max_msgs: int) -> None:
            for message in wheel.take_due(now_ms, max_msgs, share_msgs):
                assert message.id not in taken, f"{message.id} taken twice in one pass"
                assert tag_of[message.id] not in wheel.parked, f"{message.id} is parked"
                assert message.id not in cancelled
                taken.add(message.id)

        for index, step in enumerate(steps):
            if index == rewind_at:
                wheel.rewind()
                taken.clear()
            if step[0] == "park":
                wheel.park(step[1])
            elif step[0] == "take":
                take(step[1])
            elif step[0] == "file":  # late: into seconds the pass has read or walks
                file([(step[1], step[3])] * step[2], NOW_MS)
            else:
                live = sorted(h for h, name in handles.items()
                              if name not in taken and name not in cancelled)
                if live:
                    handle = live[step[1] % len(live)]
                    wheel.cancel(handle)
                    cancelled.add(handles[handle])
        wheel.park(frozenset())
        for _ in range(len(tag_of) + 10):  # a take may read its budget and find nothing yet
            batch = wheel.take_due(now_ms, 1_000)
            for message in batch:
                assert message.id not in taken and message.id not in cancelled
                taken.add(message.id)
            due_ms = wheel.next_due_ms()
            if not batch and (due_ms is None or due_ms > now_ms):
                break
        assert taken == set(tag_of) - cancelled
        skipped = {(second, local) for second, local in wheel.drain_skipped()}
        assert len(skipped) <= len(cancelled)
