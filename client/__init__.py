"""The tickwheel client library: schedule, cancel, reschedule and consume delayed messages.

`Client` blocks; `AsyncClient` is the same for asyncio. Both find the leader on their own
(every response names it), and retry with jittered back-off (tenacity) on ``UNAVAILABLE`` and
leader changes, and after the wait a node advises when the caller is over a quota of its
principal; scheduling is idempotent because every message carries an id (generated here
when you give none). Errors: `InvalidArgument` (``.field`` names what to fix), `Unavailable`
(no leader through every retry), `QuotaExceeded` (an `Unavailable`: still over a quota when
the call's time ran out; ``.quota`` names it), `RequestTooLarge` (a batch above the node's
``max_request_bytes``: split it), `Unauthenticated` and `PermissionDenied`, all
`TickwheelClientError`.

Both dial TLS with `Credentials` (a CA, a bearer token, a client certificate); without them,
`Credentials.from_env` reads ``TICKWHEEL_CA_FILE``, ``TICKWHEEL_TOKEN_FILE`` and the like.

In a cluster of several shards (docs/shards.md) both read the shard map once, send each
message to its shard (by ``routing_key``, or the id), each handle and receipt to the shard
that gave it out, and consume from every shard at once.

Every answer is the library's own type, never a generated protobuf message: `cluster_info`
answers a `ClusterInfo` (with its `Member`, `TopicDue`, `TopicPending` and `GroupInfo`),
`due_histogram` a `DueHistogram` (how many messages are due when).

`LedgerClient` reads every node's ledger, for a cluster's admins: `LedgerClient.trace` answers
a `Trace` of `TracedEvent` rows, and `fetch_ledger` copies the closed segments into a folder
(a `FetchReport` says what it did; docs/node.md, "Reading a running cluster's ledger").
"""

from tickwheel.client._core import Received
from tickwheel.client.aio import AsyncClient
from tickwheel.client.aio_consumers import AsyncConsumer
from tickwheel.client.consumers import Consumer
from tickwheel.client.credentials import Credentials
from tickwheel.client.errors import (
    InvalidArgument,
    PermissionDenied,
    QuotaExceeded,
    RequestTooLarge,
    TickwheelClientError,
    Unauthenticated,
    Unavailable,
)
from tickwheel.client.histogram import SPANS, DueHistogram
from tickwheel.client.info import ClusterInfo, GroupInfo, Member, TopicDue, TopicPending
from tickwheel.client.ledger import LedgerClient, Trace, TracedEvent
from tickwheel.client.ledger_fetch import FetchReport
from tickwheel.client.ledger_fetch import fetch as fetch_ledger
from tickwheel.client.messages import (
    CancelOutcome,
    Message,
    Rescheduled,
    RescheduleOutcome,
    Scheduled,
)
from tickwheel.client.sync import Client

__all__ = [
    "SPANS",
    "AsyncClient",
    "AsyncConsumer",
    "CancelOutcome",
    "Client",
    "ClusterInfo",
    "Consumer",
    "Credentials",
    "DueHistogram",
    "FetchReport",
    "GroupInfo",
    "InvalidArgument",
    "LedgerClient",
    "Member",
    "Message",
    "PermissionDenied",
    "QuotaExceeded",
    "Received",
    "RequestTooLarge",
    "RescheduleOutcome",
    "Rescheduled",
    "Scheduled",
    "TickwheelClientError",
    "TopicDue",
    "TopicPending",
    "Trace",
    "TracedEvent",
    "Unauthenticated",
    "Unavailable",
    "fetch_ledger",
]
