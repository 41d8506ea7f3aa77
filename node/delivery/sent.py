"""A message handed to a consumer: what the courier and the delivery trail share.

Its own module so that the courier (`tickwheel.node.delivery.courier`) can use the trail while it
reads its messages, without the two importing one another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tickwheel.replication import Delivery


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
