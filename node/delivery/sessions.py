"""A consumer's session on the leader: one `Receive` stream, or one stream-less consumer."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from tickwheel.common.errors import ConsumerStalled, InvariantViolation
from tickwheel.node.delivery.sent import Sent
from tickwheel.replication import STREAM


@dataclass(eq=False)
class Session:
    """One `Receive` stream, or one stream-less consumer (`tickwheel.node.api.unary`)."""

    key: int
    topic: str
    group: str
    name: str
    visibility_timeout_ms: int
    credits: int
    mode: int = STREAM
    """Of its leases: `STREAM` (they end with it) or `DURABLE` (only at their deadline)."""
    hold: bool = False
    """It holds a message sent ahead of its due time until then (``Subscribe.hold``): the
    courier sends it as soon as it is granted."""
    outbox: asyncio.Queue[list[Sent] | None] = field(default_factory=asyncio.Queue)
    """Batches to send; None once it is closed."""
    unacked: dict[str, Sent] = field(default_factory=dict)
    closed: BaseException | None = None
    spill: list[Sent] = field(default_factory=list)
    """Sent to a stream-less consumer and not yet taken by a call."""
    writing: list[Sent] = field(default_factory=list)
    """The batch its stream is writing; its messages count as written once gRPC took the
    response (`written`)."""
    acked: bool = False
    """It sent an ack of its group at least once (a late one too): it is never closed for
    not acking."""
    timeouts: int = 0
    """Its leases whose visibility timeout ran out while it had acked nothing."""

    async def next_batch(self) -> list[Sent]:
        """The next messages to send; raises the reason once the consumer is closed."""
        batch = await self.outbox.get()
        if batch is None:
            if self.closed is None:
                raise InvariantViolation("an outbox ended without a reason")
            raise self.closed
        return batch

    def written(self) -> None:
        """gRPC took the whole response of `writing`: it will not wait in the stream."""
        for sent in self.writing:
            sent.written = True
        self.writing = []

    def stalled(self) -> None:
        """Close a stream that does not read (`ConsumerStalled`) at once: what gRPC made of
        the response being written is all it still pins, until the stream ends."""
        self.shut(ConsumerStalled(self.visibility_timeout_ms))

    def shut(self, reason: BaseException) -> None:
        """`close` it at once, dropping what waits in its outbox and the batch it is
        writing: its leases are released with it, so none of that may still reach it."""
        while not self.outbox.empty():
            self.outbox.get_nowait()
        self.writing = []
        self.close(reason)

    def close(self, reason: BaseException) -> None:
        """End the stream: `next_batch` raises ``reason`` (the first reason given wins)."""
        if self.closed is None:
            self.closed = reason
            self.outbox.put_nowait(None)
