"""What ``DueHistogram`` answers, as the library's own type: how many pending messages are due
in each bucket of a span ahead (docs/console.md), every topic together or one topic's, with
the per-topic pending totals the caller may see. `Client.due_histogram` and
`AsyncClient.due_histogram` make the request (`histogram_request`) and read the answer
(`due_histogram`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import grpc

from tickwheel.client.errors import InvalidArgument, TickwheelClientError
from tickwheel.client.info import TopicPending
from tickwheel.v1 import tickwheel_pb2 as pb

SPANS: Final = {"minute": pb.SPAN_MINUTE, "hour": pb.SPAN_HOUR, "day": pb.SPAN_DAY,
                "year": pb.SPAN_YEAR}
"""The spans by name: 60 buckets of a second, 60 of a minute, 24 of an hour, 366 of a day."""


@dataclass(frozen=True, slots=True)
class DueHistogram:
    """Pending messages by when they are due, as one node counts them."""

    now_ms: int
    """The answering node's clock."""
    start_ms: int
    """Where the first bucket begins: the node's current second (minute, hour), or the start
    of its current hour (day, year)."""
    bucket_ms: int
    counts: tuple[int, ...]
    """Bucket ``i``: due in ``[start_ms + i * bucket_ms, start_ms + (i + 1) * bucket_ms)``."""
    overdue: int
    """Due before ``start_ms`` and not yet passed by the cursor."""
    beyond: int
    """Due after the last bucket."""
    cursor_second: int
    pending: tuple[TopicPending, ...]
    pending_untracked: int
    topic: str = ""
    """The topic whose messages the buckets count; "" for every topic."""


def histogram_request(span: str, topic: str = "") -> pb.DueHistogramRequest:
    """The request for ``span`` ("minute", "hour", "day" or "year"), of ``topic``'s messages
    alone if given."""
    if span not in SPANS:
        raise InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT,
                              f"span: {span!r} is not one of {', '.join(SPANS)}")
    return pb.DueHistogramRequest(span=SPANS[span], topic=topic)


def due_histogram(response: pb.DueHistogramResponse, topic: str = "") -> DueHistogram:
    """The answer to a request for ``topic``; a node of a release before the topic was a
    field ignores it, and its every-topic counts are refused (``UNIMPLEMENTED``)."""
    if response.topic != topic:
        raise TickwheelClientError(grpc.StatusCode.UNIMPLEMENTED, "topic: the node answered "
                                   "the histogram of every topic (an older release): ask a "
                                   "node of this release for one topic's")
    return DueHistogram(
        now_ms=response.now_ms, start_ms=response.start_ms, bucket_ms=response.bucket_ms,
        counts=tuple(response.counts), overdue=response.overdue, beyond=response.beyond,
        cursor_second=response.cursor_second,
        pending=tuple(TopicPending(p.topic, p.pending) for p in response.pending),
        pending_untracked=response.pending_untracked, topic=response.topic)
