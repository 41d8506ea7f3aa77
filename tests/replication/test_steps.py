"""The Raft thread's steps: the time between two waits of pysyncobj's poller, whatever ran in
it, counted in a histogram, the longest kept for a while, a slow one logged."""

from __future__ import annotations

import logging
import socket
import time

import pytest
from pysyncobj.poller import PollPoller

from tickwheel.replication.raft.steps import BOUNDS_MS, WINDOW_S, StepTimes


def test_the_work_between_two_waits_is_one_step_and_a_slow_one_is_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    poller = PollPoller()
    steps = StepTimes()
    steps.wrap(poller)
    left, right = socket.socketpair()
    try:
        poller.subscribe(left.fileno(), lambda descr, event: left.recv(16), 1)
        right.send(b"x")
        poller.poll(1.0)  # a wait that ends at once: the socket is readable
        started = time.monotonic()
        while time.monotonic() - started < 0.06:  # the step's work
            pass
        with caplog.at_level(logging.WARNING, "tickwheel.replication.raft"):
            poller.poll(0)
    finally:
        left.close()
        right.close()
    summary = steps.summary()
    assert sum(summary.counts) == 1
    assert 60 <= summary.sum_ms < 1_000 and summary.longest_ms == summary.sum_ms
    assert summary.counts[BOUNDS_MS.index(100.0)] == 1  # in the bucket of 50-100 ms
    assert "event=raft_step_slow" in caplog.text


def test_the_longest_step_is_forgotten_after_the_window() -> None:
    steps = StepTimes()
    steps.record_ms(300.0, 1_000.0)
    steps.record_ms(2.0, 1_000.0 + WINDOW_S / 2)
    assert steps.longest_ms == 300.0  # still within the window
    steps.record_ms(3.0, 1_000.0 + WINDOW_S)
    assert steps.longest_ms == 3.0
    assert steps.summary().counts[-1] == 0 and sum(steps.summary().counts) == 3


def test_a_poller_it_cannot_time_is_refused() -> None:
    with pytest.raises(TypeError, match="cannot time"):
        StepTimes().wrap(object())
