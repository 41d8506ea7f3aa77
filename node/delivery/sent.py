"""A message handed to a consumer, and the ledger's ``sent`` rows of a batch of them.

Its own module so that the courier (`tickwheel.node.delivery.courier`), its sessions and its
receipts share it without importing one another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tickwheel.replication import Delivery, LedgerRows


@dataclass(eq=False, slots=True)
class Sent:
    """One message on its way to (or at) a consumer: its lease, what the consumer sees."""

    delivery: Delivery
    receipt: str
    attempt: int
    delivered_at_ms: int
    """When the consumer may hand it to the application (the leader's clock): when it was
    sent, or, sent ahead to a consumer that holds, the end of its hold."""
    properties: Mapping[str, str]
    hold_ms: int = 0
    """How long the consumer holds it after it arrives (``Delivered.hold_ms``)."""
    written: bool = False
    """Written to its consumer's stream: gRPC took the whole response, which a consumer that
    does not read stops (flow control) within a few megabytes."""


def sent_rows(batch: list[Sent], group: str, consumer: str, term: int, now_ms: int
              ) -> LedgerRows:
    """The ledger's ``sent`` rows of one batch sent to ``consumer`` of ``group``, as columns
    (`tickwheel.node.ledger.schema`): a list comprehension each, on the event loop."""
    deliveries = [sent.delivery for sent in batch]
    messages = [delivery.message for delivery in deliveries]
    return LedgerRows("sent", now_ms, {
        "time_ms": [sent.delivered_at_ms for sent in batch],
        "term": [term] * len(batch),
        "epoch": [delivery.epoch for delivery in deliveries],
        "handle": [message.handle for message in messages],
        "id": [message.id for message in messages],
        "topic": [message.topic for message in messages],
        "group": [group] * len(batch),
        "consumer": [consumer] * len(batch),
        "lease": [delivery.lease.seq for delivery in deliveries],
        "possible_duplicate": [delivery.possible_duplicate for delivery in deliveries],
        "attempt": [sent.attempt for sent in batch],
        "deliver_at_ms": [message.deliver_at_ms for message in messages],
        "slot_second": [message.slot_second for message in messages],
        "local_index": [message.local_index for message in messages]})
