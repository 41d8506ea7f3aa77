"""`make demo`'s script, on a fake clock whose sleep moves time instead of waiting."""

from pathlib import Path

import pytest
from tickwheel.node import demo


class FakeClock:
    """Time moves only when someone sleeps; it never goes backwards."""

    def __init__(self, start_ms: int) -> None:
        self.now_ms = start_ms

    def __call__(self) -> int:
        return self.now_ms

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now_ms += round(seconds * 1_000)


def test_the_demo_delivers_every_due_message_on_time(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    clock = FakeClock(1_800_000_000_000)
    assert demo.run(clock, clock.sleep, str(tmp_path), seed=3) == 13
    rows = [line.split() for line in capsys.readouterr().out.splitlines()
            if line.startswith(("order-", "overdue"))]
    assert len(rows) == 13
    assert {row[0] for row in rows} == {f"order-{i}" for i in range(12)} | {"overdue"}
    assert all(int(row[3]) == 0 for row in rows if row[0] != "overdue")
    assert clock.now_ms - 1_800_000_000_000 < 5_000
