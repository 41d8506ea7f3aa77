"""How much one response to a consumer carries: at most a number of messages and at most a
number of bytes of them, whatever the consumer's credits (credits count messages, and 100
credits of 4 MiB messages would not fit a gRPC message).

A message's bytes are counted from above (`delivered_bytes`): its body and properties as they
are, every other field of its `Delivered` at the most the limits allow, so a response of
``max_bytes`` counted bytes encodes to at most ``max_bytes``. A response carries at least one
message, however large; a node starts only if a message at the limits fits a response alone
(`NodeSettings`), so every message it accepts can be delivered.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from tickwheel.node.delivery.sent import Sent

GRPC_MESSAGE_BYTES = 64 << 20
"""The largest gRPC message a node sends, and reads from another member (its answers to
forwarded calls, the responses of a stream it proxies): `tickwheel.node.api.forward`'s
``CHANNEL_OPTIONS``. The client library reads as much."""
ENVELOPE_BYTES = 1 << 20
"""Room in a response for what is not counted in its messages' bytes: RocketMQ's own fields
around each message it passes on, and a margin."""
DELIVERED_FIELDS_BYTES = 2 << 10
"""A `Delivered`'s fields other than its body and properties, at their largest, with its own
framing in the response: id (256 bytes), topic (254: a dead-letter topic), group (128),
receipt (32), the leader's address (a host name and a port: 259), five integers and a flag
(46), tags and lengths (28); about 1 KiB in all."""
PROPERTY_FRAMING_BYTES = 16
"""A property's map entry besides its key and value: tags and lengths (at most 12)."""


def delivered_bytes(sent: Sent) -> int:
    """At least the bytes ``sent`` takes in a response."""
    size = len(sent.delivery.message.body) + DELIVERED_FIELDS_BYTES
    for key, value in sent.properties.items():
        size += len(key.encode()) + len(value.encode()) + PROPERTY_FRAMING_BYTES
    return size


def fitting(sents: Sequence[Sent], max_msgs: int, max_bytes: int) -> int:
    """How many of the first of ``sents`` one response carries: at most ``max_msgs``, of at
    most ``max_bytes`` together, and at least one."""
    total_bytes = 0
    for count, sent in enumerate(sents[:max_msgs]):
        total_bytes += delivered_bytes(sent)
        if total_bytes > max_bytes:
            return max(count, 1)
    return min(len(sents), max_msgs)


def split(sents: list[Sent], max_msgs: int, max_bytes: int) -> Iterator[list[Sent]]:
    """``sents`` in order, in the batches responses carry (`fitting`)."""
    start = 0
    while start < len(sents):
        end = start + fitting(sents[start:start + max_msgs], max_msgs, max_bytes)
        yield sents[start:end]
        start = end
