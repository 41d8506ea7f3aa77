"""Delay levels and the retry ladder, as RocketMQ users know them (seeds 001 and 002).

A *level table* is RocketMQ's ``messageDelayLevel``: durations separated by spaces, each a
whole number and one unit, ``s``, ``m``, ``h`` or ``d``. Level 1 is the first duration::

    >>> levels = parse_levels("1s 5s 10s 30s 1m")
    >>> levels.delay_ms(3), levels.delay_ms(9)     # (delay, level used): 9 is clamped to 5
    ((10000, 3), (60000, 5))
    >>> format_levels(levels)
    '1s 5s 10s 30s 1m'

RocketMQ splits on single spaces, takes the last character as the unit and logs a parse error
while carrying on; here runs of whitespace separate too, and an unknown unit, a missing number
or an empty table raise `ValueError`, which the node's configuration turns into a start-up
error. A level above the last is clamped to the last, as RocketMQ does.

The *retry ladder*: a consumer that nacks a message it received as attempt ``k`` (or lets its
visibility timeout run out) gets a copy after level ``start_level + k - 1`` (clamped to the
last level), as attempt ``k + 1``. The default starts at level 3 (10 s, 30 s, 1 m, ...), like
RocketMQ's consumer retry. A nack of attempt ``max_attempts`` sends the message to its topic's
dead-letter topic ``%DLQ%<topic>`` at once instead; a nack there retries it in the same
topic, on the ladder, and never dead-letters it again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

DEFAULT_LEVELS: Final = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
UNIT_MS: Final = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
MAX_LEVELS: Final = 1_000
"""The most levels a table may have (RocketMQ has no limit; 18 is its default)."""
DLQ_PREFIX: Final = "%DLQ%"
_TOKEN = re.compile(r"(\d+)([a-zA-Z]*)")


@dataclass(frozen=True, slots=True)
class DelayLevels:
    """A parsed level table: ``delays_ms[0]`` is level 1."""

    delays_ms: tuple[int, ...]

    @property
    def max_level(self) -> int:
        return len(self.delays_ms)

    def delay_ms(self, level: int) -> tuple[int, int]:
        """``(delay_ms, level used)`` for ``level`` >= 1; above the last, the last."""
        used = min(level, self.max_level)
        return self.delays_ms[used - 1], used


def parse_levels(text: str) -> DelayLevels:
    """``"1s 5s 1m"`` -> `DelayLevels`; raises `ValueError` naming the bad part."""
    tokens = text.split()
    if not tokens:
        raise ValueError("the delay level table is empty; give durations like '1s 5s 10s 1m'")
    if len(tokens) > MAX_LEVELS:
        raise ValueError(f"the delay level table has {len(tokens)} levels, at most {MAX_LEVELS}")
    delays_ms = []
    for level, token in enumerate(tokens, 1):
        match = _TOKEN.fullmatch(token)
        if match is None or match[2] not in UNIT_MS:
            raise ValueError(f"level {level} is {token!r}: not a whole number followed by one "
                             f"of the units {', '.join(UNIT_MS)}")
        delays_ms.append(int(match[1]) * UNIT_MS[match[2]])
    return DelayLevels(tuple(delays_ms))


def format_levels(levels: DelayLevels) -> str:
    """The table as text, each delay in the largest unit that divides it exactly."""
    return " ".join(_duration(delay_ms) for delay_ms in levels.delays_ms)


def _duration(delay_ms: int) -> str:
    if delay_ms == 0:
        return "0s"
    for unit, unit_ms in sorted(UNIT_MS.items(), key=lambda item: -item[1]):
        if delay_ms % unit_ms == 0:
            return f"{delay_ms // unit_ms}{unit}"
    raise ValueError(f"{delay_ms} ms is not a whole number of seconds")


def is_dead_letter_topic(topic: str) -> bool:
    return topic.startswith(DLQ_PREFIX)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Where and when a nacked message comes back (see the module docstring)."""

    levels: DelayLevels
    start_level: int = 3
    max_attempts: int = 16

    def __post_init__(self) -> None:
        if not 1 <= self.start_level <= self.levels.max_level:
            raise ValueError(f"retry_start_level is {self.start_level}, must be 1 to "
                             f"{self.levels.max_level} (the delay level table's last level)")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts is {self.max_attempts}, must be at least 1")

    def next_copy(self, topic: str, attempt: int) -> tuple[str, int]:
        """``(topic, delay_ms)`` of the copy that follows a nack of ``attempt``."""
        if attempt >= self.max_attempts and not is_dead_letter_topic(topic):
            return DLQ_PREFIX + topic, 0
        delay_ms, _ = self.levels.delay_ms(self.start_level + attempt - 1)
        return topic, delay_ms
