"""How long the Raft thread works between two waits on its poller: its *steps*.

Everything a node does for Raft runs on one thread (`tickwheel.replication.Replica`), and it
answers nothing while it works: a step longer than the election timeout (500 ms) lets the
followers elect another leader, and a step of a follower's delays every answer the leader
counts its tenure from. So every step is measured. pysyncobj's poller (``PollPoller``) waits
in ``select.poll().poll`` and then runs the socket callbacks; `StepTimes` wraps that system
call, so a step is the time from the end of one wait to the start of the next, whatever ran
in it (the callbacks, applying, snapshots, the replica's dispatch step).

`StepTimes` keeps a histogram of the steps (``BOUNDS_MS``), the longest within the last
``WINDOW_S`` seconds, and logs ``event=raft_step_slow`` (at most once a second) for a step of
``SLOW_STEP_MS`` or more. Written on the Raft thread; read by metrics from any thread (a
snapshot of plain counters, no lock needed for a gauge's value).
"""

from __future__ import annotations

import bisect
import logging
import select
import time
from typing import Final

from tickwheel.replication.raft.port import StepSummary

log = logging.getLogger("tickwheel.replication.raft")

BOUNDS_MS: Final = (1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0)
"""The histogram's upper bounds, in ms."""
WINDOW_S: Final = 10.0
"""The longest step is the longest within this long (two halves: 5 to 10 s)."""
SLOW_STEP_MS: Final = 50.0
SLOW_LOG_S: Final = 1.0


class StepTimes:
    """Steps of one Raft thread: counts per bucket of ``BOUNDS_MS`` (the last is +Inf), their
    sum, and the longest recently."""

    def __init__(self) -> None:
        self.counts = [0] * (len(BOUNDS_MS) + 1)
        self.sum_ms = 0.0
        self._longest_ms = [0.0, 0.0]
        """The longest step in the current half window, and in the one before."""
        self._half_started_s: float | None = None
        self._wait_ended_s: float | None = None
        self._slow_logged_s = 0.0

    @property
    def longest_ms(self) -> float:
        """The longest step within the last ``WINDOW_S`` (at least its half)."""
        return max(self._longest_ms)

    def summary(self) -> StepSummary:
        return StepSummary(BOUNDS_MS, tuple(self.counts), self.sum_ms, self.longest_ms)

    def wrap(self, poller: object) -> None:
        """Time the waits of pysyncobj's ``PollPoller`` (``TypeError`` for another poller)."""
        name = "_PollPoller__poll"
        inner = getattr(poller, name, None)
        if inner is None:
            raise TypeError(f"cannot time the steps of a {type(poller).__name__}")
        setattr(poller, name, _TimedPoll(inner, self))

    def waiting(self, now_s: float) -> None:
        """The thread starts to wait: the step since the last wait ended is over."""
        if self._wait_ended_s is not None:
            self.record_ms((now_s - self._wait_ended_s) * 1000, now_s)

    def woke(self, now_s: float) -> None:
        self._wait_ended_s = now_s

    def record_ms(self, step_ms: float, now_s: float) -> None:
        self.counts[bisect.bisect_left(BOUNDS_MS, step_ms)] += 1
        self.sum_ms += step_ms
        if self._half_started_s is None:
            self._half_started_s = now_s
        elif now_s - self._half_started_s >= WINDOW_S / 2:
            self._half_started_s = now_s
            self._longest_ms = [0.0, self._longest_ms[0]]
        self._longest_ms[0] = max(self._longest_ms[0], step_ms)
        if step_ms >= SLOW_STEP_MS and now_s - self._slow_logged_s >= SLOW_LOG_S:
            self._slow_logged_s = now_s
            log.warning("event=raft_step_slow step_ms=%.1f election_risk=%s", step_ms,
                        "the Raft thread answered nothing meanwhile")


class _TimedPoll:
    """``select.poll()``'s object, its ``poll`` timed for `StepTimes`."""

    __slots__ = ("_inner", "_steps")

    def __init__(self, inner: select.poll, steps: StepTimes) -> None:
        self._inner = inner
        self._steps = steps

    def poll(self, timeout_ms: float | None = None) -> list[tuple[int, int]]:
        self._steps.waiting(time.monotonic())
        try:
            return self._inner.poll(timeout_ms)
        finally:
            self._steps.woke(time.monotonic())

    def register(self, fd: int, eventmask: int) -> None:
        self._inner.register(fd, eventmask)

    def modify(self, fd: int, eventmask: int) -> None:
        self._inner.modify(fd, eventmask)

    def unregister(self, fd: int) -> None:
        self._inner.unregister(fd)
