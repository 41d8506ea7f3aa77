"""Consumer streams that read and never acknowledge: which the courier closes, and how.

A stream whose consumer takes messages and acknowledges none (a handler that forgot
``message.ack()``, one stuck on every message, one slower than its visibility timeout) got
each message back on every visibility timeout for its whole retry budget (``max_attempts``):
each retry could go to it again, while the group's healthy consumers sat idle, until the
message was dead-lettered. So a stream that has acked nothing (`Session.acked`) has the
leases counted whose visibility timeout runs out (`Session.timeouts`); at
``max_unacked_timeouts`` the courier closes it (`ConsumerNotAcking`, gRPC
``FAILED_PRECONDITION``) and releases its leases, as any closed stream's: its messages are
ready again at once for the group's other consumers, each with ``attempt + 1`` and flagged
``possible_duplicate``. The leases that ran out below the bound were retried as ever.

One ack of its group, ever (one that comes after its lease ran out too), exempts a stream for
good: it handles messages, however slowly. Only streams are counted: a stream-less consumer's
deadline is its own choice of when to see a message again (`tickwheel.node.api.unary`), and
a stream that does not read is closed for that first (`Session.stalled`).

Called by the courier (`tickwheel.node.delivery.courier`), on its loop.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from tickwheel.common.errors import ConsumerNotAcking
from tickwheel.node.delivery.sessions import Session
from tickwheel.replication import STREAM, Expired

log = logging.getLogger("tickwheel.delivery")


def reaching_bound(expired: list[Expired], consumers: Mapping[int, Session],
                   skipped: Mapping[int, Session], bound: int) -> dict[int, Session]:
    """Count each of these expired leases against its stream, if that has acked nothing
    and is not in ``skipped``; the streams that reach ``bound`` (none if it is 0)."""
    reached: dict[int, Session] = {}
    if not bound:
        return reached
    for item in expired:
        holder = consumers.get(item.consumer) if item.consumer is not None else None
        if (holder is None or holder.mode != STREAM or holder.acked
                or holder.key in skipped or holder.closed is not None):
            continue
        holder.timeouts += 1
        if holder.timeouts >= bound:
            reached[holder.key] = holder
    return reached


def close(consumer: Session, bound: int) -> None:
    """Close a stream that reached the bound, at once (`Session.shut`: nothing it was to be
    sent still reaches it); the courier then releases its leases."""
    log.warning("event=consumer_closed reason=no_acks topic=%s group=%r consumer=%r "
                "timeouts=%d unacked=%d visibility_timeout_ms=%d max_unacked_timeouts=%d",
                consumer.topic, consumer.group, consumer.name, consumer.timeouts,
                len(consumer.unacked), consumer.visibility_timeout_ms, bound)
    consumer.shut(ConsumerNotAcking(consumer.name, consumer.timeouts,
                                    consumer.visibility_timeout_ms))
