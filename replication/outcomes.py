"""What applying a command answers its proposer, message by message: the same on every
replica, since each applies the same commands in the same order."""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

from tickwheel.common.errors import InvalidMessage, Overloaded, PermissionDenied, UnknownHandle


class Accepted(NamedTuple):
    """What scheduling one message returned. ``duplicate``: its id was seen in the window, and
    these are the first scheduling's handle and the message's due time now (a reschedule
    moves it)."""

    handle: int
    deliver_at_ms: int
    duplicate: bool


class Retried(NamedTuple):
    """What rescheduling one delivered message returned: the retry copy's handle and due time,
    or ``handle`` None when the message it replaces was already retired (rescheduled before,
    cancelled, or done): then nothing was filed."""

    handle: int | None
    deliver_at_ms: int


class Rejected(NamedTuple):
    """A message or handle refused at apply time (the same on every replica)."""

    error: InvalidMessage | UnknownHandle | Overloaded | PermissionDenied


class MoveOutcome(IntEnum):
    """What rescheduling one message did (the values of the proto's ``RescheduleOutcome``)."""

    RESCHEDULED = 1
    """It was pending and is now due at the new time (also when it already was: a repeat)."""
    CANCELLED = 2
    """It had been cancelled: nothing to move."""
    NOT_PENDING = 3
    """Done: delivered and acked, or its hour has passed."""
    HANDED_OUT = 4
    """Too late: a consumer group had it already; it stays where it was."""


class Moved(NamedTuple):
    """What rescheduling one message returned: the outcome and the message's due time now
    (the new one when ``RESCHEDULED``; the old one when ``HANDED_OUT``; else 0)."""

    outcome: MoveOutcome
    deliver_at_ms: int
