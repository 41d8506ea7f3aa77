"""A live clock step (`tickwheel.node.ops.clock_step`): obeyed only by a node started for
testing, refused (and said so) by any other."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tickwheel.common.clock import SystemClock
from tickwheel.node import write_clock_offset
from tickwheel.node.ops.clock_step import ClockStep


def test_a_node_started_for_testing_steps_its_clock_once_per_write(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = SystemClock(250)
    step = ClockStep(clock, tmp_path, allowed=True)
    step.check()
    assert clock.skew_ms == 250  # no file: the start's offset stands
    write_clock_offset(tmp_path, 5_000)
    with caplog.at_level(logging.WARNING, "tickwheel.node"):
        step.check()
        step.check()
    assert clock.skew_ms == 5_000
    assert caplog.text.count("event=clock_stepped offset_ms=5000 previous_offset_ms=250") == 1
    write_clock_offset(tmp_path, -5_000)
    step.check()
    assert clock.skew_ms == -5_000


def test_a_production_node_ignores_the_file_and_says_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = SystemClock()
    step = ClockStep(clock, tmp_path, allowed=False)
    write_clock_offset(tmp_path, 5_000)
    with caplog.at_level(logging.WARNING, "tickwheel.node"):
        step.check()
        step.check()
    assert clock.skew_ms == 0
    assert caplog.text.count("event=fault_injection_refused") == 1


@pytest.mark.parametrize("content", ["soon", "1e3", str(10**12)])
def test_a_step_that_is_not_a_sane_offset_is_refused(
        tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture) -> None:
    clock = SystemClock()
    (tmp_path / "clock-offset-ms").write_text(content)
    with caplog.at_level(logging.ERROR, "tickwheel.node"):
        ClockStep(clock, tmp_path, allowed=True).check()
    assert clock.skew_ms == 0
    assert "event=clock_step_refused" in caplog.text
