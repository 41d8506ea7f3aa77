"""What a client sends and what its calls answer, for the sync and asyncio clients alike: a
message to schedule and the request it goes in, a scheduled message's handle, the outcomes of
cancels and reschedules. No I/O here."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from tickwheel.v1 import tickwheel_pb2 as pb


@dataclass(frozen=True, slots=True)
class Message:
    """A message to schedule: give exactly one of ``deliver_at_ms``, ``delay_ms`` and
    ``delay_level`` (RocketMQ's level: 1 is the first delay of the node's table). Without an
    ``id`` one is generated here, so retries stay idempotent. In a cluster of several shards
    the id places the message, or ``routing_key`` when given: messages of one key share a
    shard."""

    topic: str
    body: bytes | str
    deliver_at_ms: int | None = None
    delay_ms: int | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    properties: Mapping[str, str] = field(default_factory=dict)
    delay_level: int | None = None
    routing_key: str = ""

    def to_pb(self) -> pb.Message:
        return self.fill_pb(pb.Message())

    def fill_pb(self, message: pb.Message) -> pb.Message:
        """Set this message's fields on an empty ``message`` (one of a request's, added in
        place: see `schedule_request`); returns it."""
        body = self.body.encode() if isinstance(self.body, str) else self.body
        message.id, message.topic, message.body = self.id, self.topic, body
        if self.properties:  # an empty map still costs a conversion per message
            message.properties.update(self.properties)
        if self.deliver_at_ms is not None:
            message.deliver_at_ms = self.deliver_at_ms
        if self.delay_ms is not None:
            message.delay_ms = self.delay_ms
        if self.delay_level is not None:
            message.delay_level = self.delay_level
        if self.routing_key:
            message.routing_key = self.routing_key
        return message


def schedule_request(messages: Iterable[Message]) -> pb.ScheduleRequest:
    """A `Schedule` request of ``messages``, each built in place: a ``pb.Message`` built apart
    is copied into the request, which took a third of the client's time per message."""
    request = pb.ScheduleRequest()
    add = request.messages.add
    for message in messages:
        message.fill_pb(add())
    return request


class Scheduled(NamedTuple):
    """What scheduling one message returned. A named tuple, not a frozen dataclass: a batch
    makes one per message, and a frozen dataclass took 1.1 us to build, this 0.4."""

    id: str
    handle: int
    deliver_at_ms: int
    duplicate: bool
    """The id was scheduled before (a retry); these are the first scheduling's handle, and
    the due time the message has now (a reschedule moves it)."""
    clamped_delay_level: int = 0
    """The level used when ``delay_level`` was above the node's last level; else 0."""


def scheduled(response: pb.ScheduleResponse) -> list[Scheduled]:
    return [Scheduled(r.id, r.handle, r.deliver_at_ms, r.duplicate, r.clamped_delay_level)
            for r in response.results]


class CancelOutcome(enum.Enum):
    """What a cancel did to one message. Cancelling is idempotent: if the answer to a cancel was
    lost in a leader change and the client retried it, the retry reads ``ALREADY_CANCELLED``."""

    CANCELLED = "cancelled"
    """It was pending; it will not be delivered (again)."""
    ALREADY_CANCELLED = "already_cancelled"
    """An earlier cancel got it."""
    NOT_PENDING = "not_pending"
    """Too late: delivered and acked, or its hour has passed."""
    HANDED_OUT = "handed_out"
    """Too late: a consumer group had it already; groups that had not got it never will."""

    @property
    def cancelled(self) -> bool:
        """Whether the message is cancelled, by this call or an earlier one."""
        return self in (CancelOutcome.CANCELLED, CancelOutcome.ALREADY_CANCELLED)


_CANCEL_OUTCOMES = {pb.CANCEL_OUTCOME_CANCELLED: CancelOutcome.CANCELLED,
                    pb.CANCEL_OUTCOME_ALREADY_CANCELLED: CancelOutcome.ALREADY_CANCELLED,
                    pb.CANCEL_OUTCOME_NOT_PENDING: CancelOutcome.NOT_PENDING,
                    pb.CANCEL_OUTCOME_HANDED_OUT: CancelOutcome.HANDED_OUT}


def cancel_outcomes(response: pb.CancelResponse) -> list[CancelOutcome]:
    return [_CANCEL_OUTCOMES[outcome] for outcome in response.outcomes]


class RescheduleOutcome(enum.Enum):
    """What a reschedule did to one message. Repeating one is safe: a message already due at
    the asked time reads ``RESCHEDULED`` and does not move."""

    RESCHEDULED = "rescheduled"
    """It is due at the new time (and will not be delivered at the old one)."""
    CANCELLED = "cancelled"
    """It had been cancelled: nothing to move."""
    NOT_PENDING = "not_pending"
    """Too late: delivered and acked, or its hour has passed."""
    HANDED_OUT = "handed_out"
    """Too late: a consumer group had it already; it stays due at its old time."""


class Rescheduled(NamedTuple):
    outcome: RescheduleOutcome
    deliver_at_ms: int
    """When it is due now: the new time, or the old one if ``HANDED_OUT``; 0 otherwise."""


_RESCHEDULE_OUTCOMES = {
    pb.RESCHEDULE_OUTCOME_RESCHEDULED: RescheduleOutcome.RESCHEDULED,
    pb.RESCHEDULE_OUTCOME_CANCELLED: RescheduleOutcome.CANCELLED,
    pb.RESCHEDULE_OUTCOME_NOT_PENDING: RescheduleOutcome.NOT_PENDING,
    pb.RESCHEDULE_OUTCOME_HANDED_OUT: RescheduleOutcome.HANDED_OUT}


def reschedule_request(handles: Sequence[int], deliver_at_ms: int | None,
                       delay_ms: int | None) -> pb.RescheduleRequest:
    """Every handle to one new time: ``deliver_at_ms`` or ``delay_ms`` (exactly one)."""
    if (deliver_at_ms is None) == (delay_ms is None):
        raise ValueError("give exactly one of deliver_at_ms and delay_ms")
    when = {"deliver_at_ms": deliver_at_ms} if delay_ms is None else {"delay_ms": delay_ms}
    return pb.RescheduleRequest(moves=[pb.Move(handle=handle, **when) for handle in handles])


def reschedule_results(response: pb.RescheduleResponse) -> list[Rescheduled]:
    return [Rescheduled(_RESCHEDULE_OUTCOMES[r.outcome], r.deliver_at_ms)
            for r in response.results]


