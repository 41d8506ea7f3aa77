"""The engine against the reference model, driven by hypothesis.

Steps: schedule, cancel, advance the clock, take what is due, advance the cursor, rewind,
close-and-reopen, and tear a segment file at a random byte (then reopen). After every step the
two must agree on what is due, in what order, and when the next message is due.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import hypothesis.strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from tickwheel.wheel import Cursor, NewMessage, Wheel, WheelConfig
from tickwheel.wheel.format import TOMBSTONE, UNIT, UNIT_SIZE
from wheel_model import Model

HOUR_MS = 3_600_000
START_MS = 10 * HOUR_MS + 1_234
# Tiny limits so that short runs exercise window loading in pieces, segment eviction and
# automatic flushes.
CONFIG = WheelConfig(preload_ms=2_000, max_window_msgs=4, max_open_hours=2,
                     max_buffered_bytes=1_500)

delays_ms = st.one_of(
    st.integers(-2 * HOUR_MS, 0),  # already due
    st.integers(0, 3_000),  # within the preload window
    st.integers(0, 3 * HOUR_MS),  # a few hours ahead
    st.sampled_from([0, 999, 1_000, 1_001, HOUR_MS - 1, HOUR_MS]),  # edges
)
properties = st.dictionaries(st.text(max_size=5), st.text(max_size=8), max_size=2)


class WheelMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="tickwheel-stateful-"))
        self.wheel = Wheel.open(self.root, CONFIG)
        self.model = Model()
        self.now_ms = START_MS
        self.serial = 0

    def teardown(self) -> None:
        self.wheel.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def reopen(self) -> None:
        self.wheel = Wheel.open(self.root, CONFIG)
        self.model.rewind()

    @rule(batch=st.lists(st.tuples(delays_ms, st.binary(max_size=40), properties),
                         min_size=1, max_size=6),
          stamp_lag_ms=st.integers(0, 5_000))
    def schedule(self, batch: list, stamp_lag_ms: int) -> None:
        messages = []
        for delay_ms, body, props in batch:
            self.serial += 1
            messages.append(NewMessage(f"m{self.serial}", "orders", body,
                                       max(0, self.now_ms + delay_ms), props))
        stamp_ms = self.now_ms - stamp_lag_ms  # stamps may lag; the wheel keeps them monotonic
        handles = self.wheel.schedule(messages, stamp_ms)
        self.model.schedule(messages, stamp_ms, handles)

    @precondition(lambda self: self.model.entries)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        handle = data.draw(st.sampled_from(sorted(self.model.entries)))
        assert self.wheel.cancel(handle) == self.model.cancel(handle)

    @rule(step_ms=st.one_of(st.integers(0, 3_000), st.integers(0, 2 * HOUR_MS)))
    def advance_clock(self, step_ms: int) -> None:
        self.now_ms += step_ms

    @rule(max_msgs=st.integers(1, 8))
    def take_due(self, max_msgs: int) -> None:
        got = self.wheel.take_due(self.now_ms, max_msgs)
        want = self.model.take(self.now_ms, max_msgs)
        assert [(m.id, m.body, dict(m.properties), m.deliver_at_ms, m.position, m.handle)
                for m in got] == [(e.id, e.body, e.properties, e.deliver_at_ms, e.key, e.handle)
                                  for e in want]

    @rule(data=st.data())
    def advance_cursor(self, data: st.DataObject) -> None:
        limit = self.model.cursor_limit()
        if limit is None:
            last = max((e.slot for e in self.model.entries.values()), default=0)
            limit = max((max(last + 1, self.now_ms // 1000), 0), self.model.cursor)
        choices = {limit, (limit[0], 0), self.model.cursor}
        choices |= {e.key for e in self.model.entries.values()
                    if e.taken and self.model.cursor <= e.key <= limit}
        target = data.draw(st.sampled_from(sorted(c for c in choices
                                                  if self.model.cursor <= c <= limit)))
        self.wheel.advance_cursor(Cursor(*target))
        self.model.cursor = target

    @rule()
    def rewind(self) -> None:
        self.wheel.rewind()
        self.model.rewind()

    @rule()
    def close_and_reopen(self) -> None:
        self.wheel.close()
        self.reopen()

    @rule(data=st.data())
    def tear_a_file(self, data: st.DataObject) -> None:
        self.wheel.close()
        files = sorted(p for p in self.root.glob("hours/*/*") if p.stat().st_size)
        if files:
            victim = data.draw(st.sampled_from(files))
            cut = data.draw(st.integers(0, victim.stat().st_size - 1))
            self.model.lose(*_what_survives(victim, cut))
            with open(victim, "r+b") as file:
                file.truncate(cut)
        self.reopen()

    @invariant()
    def next_due_is_never_late(self) -> None:
        got, want = self.wheel.next_due_ms(), self.model.next_due_ms()
        if want is not None:
            assert got is not None and got <= want
        if got is not None and got != want and (want is None or got != want // 1000 * 1000):
            # Earlier than the start of the next due second only for a second not yet loaded
            # whose messages are all cancelled or done.
            assert got % 1000 == 0
            assert all(e.cancelled or e.key < self.model.cursor or e.taken
                       for e in self.model.entries.values() if e.slot == got // 1000)

    @invariant()
    def agrees_on_cursor_and_stamp(self) -> None:
        assert tuple(self.wheel.cursor) == self.model.cursor
        assert self.wheel.stamp_ms == self.model.stamp_ms


def _what_survives(victim: Path, cut: int) -> tuple[int, int, set[int]]:
    """``(hour, surviving units, lost tombstones)`` once ``victim`` is cut at byte ``cut``."""
    folder = victim.parent
    hour = int(folder.name)
    index = (folder / "index").read_bytes() if (folder / "index").exists() else b""
    units = [UNIT.unpack_from(index, i * UNIT_SIZE) for i in range(len(index) // UNIT_SIZE)]
    survivors = len(units)
    if victim.name == "index":
        survivors = cut // UNIT_SIZE
    elif victim.name == "log":
        survivors = next((i for i, u in enumerate(units) if u[0] + u[1] > cut), len(units))
    lost_tombstones: set[int] = set()
    if victim.name == "tombstones":
        data = victim.read_bytes()
        lost_tombstones = {global_index for global_index, _ in
                           TOMBSTONE.iter_unpack(data[cut // TOMBSTONE.size * TOMBSTONE.size:
                                               len(data) // TOMBSTONE.size * TOMBSTONE.size])}
    return hour, survivors, lost_tombstones


TestWheelAgainstModel = WheelMachine.TestCase
