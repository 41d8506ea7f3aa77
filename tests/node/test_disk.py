"""`DiskWatch`: which member's disk holds new messages back, and for how long a report counts
(a fake clock and fake measurements; tests/node/test_full_disk.py has the real disks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tickwheel.common.errors import DiskLow, Overloaded
from tickwheel.node.ops.disk import OWN_MEASURE_S, REPORT_TTL_S, DiskWatch, Space

RESERVE = 1_000


class Fake:
    def __init__(self) -> None:
        self.now = 0.0
        self.free = 5_000

    def clock(self) -> float:
        return self.now

    def measure(self, path: Path) -> int:
        return self.free


def watch(fake: Fake) -> DiskWatch:
    return DiskWatch("a:1", Path("."), RESERVE, measure=fake.measure, clock=fake.clock)


def test_its_own_disk_below_the_reserve_refuses_and_names_it() -> None:
    fake = Fake()
    disks = watch(fake)
    disks.check()
    fake.free = RESERVE - 1
    disks.check()  # measured at most every OWN_MEASURE_S: not yet
    fake.now += OWN_MEASURE_S
    with pytest.raises(DiskLow) as low:
        disks.check()
    assert isinstance(low.value, Overloaded) and low.value.member == "a:1"
    assert "999 bytes free, below its reserve of 1000" in str(low.value)
    fake.free, fake.now = RESERVE, fake.now + OWN_MEASURE_S
    disks.check()  # exactly the reserve left is enough


def test_a_peer_counts_while_its_report_is_fresh_and_not_once_it_stops_answering() -> None:
    fake = Fake()
    disks = watch(fake)
    disks.note(Space("b:1", 10, 500))
    with pytest.raises(DiskLow, match="on b:1"):
        disks.check()
    disks.note(Space("b:1", 600, 500))
    disks.check()
    disks.note(Space("c:1", 0, 500))
    fake.now += REPORT_TTL_S  # c stopped answering after its last report; b answers on
    disks.note(Space("b:1", 600, 500))
    disks.check()
    disks.note(Space("c:1", 0, 500))
    disks.forget("c:1")  # it failed to answer
    disks.check()
    assert [space.member for space in disks.spaces()] == ["a:1", "b:1"]


def test_a_reserve_of_zero_never_refuses() -> None:
    fake = Fake()
    fake.free = 0
    disks = DiskWatch("a:1", Path("."), 0, measure=fake.measure, clock=fake.clock)
    disks.check()
