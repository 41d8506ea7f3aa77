"""What the sync and asyncio clients share: what a client holds, received messages, the
keepalive, and how consumer requests are merged (messages sent and calls' results:
`tickwheel.client.messages`; leader routing: `tickwheel.client.routing`; errors:
`tickwheel.client.errors`; retries: `tickwheel.client.retries`). No I/O here."""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, Protocol, TypeVar

import grpc

from tickwheel.client.credentials import Credentials
from tickwheel.client.errors import TickwheelClientError
from tickwheel.client.routing import ShardRouters
from tickwheel.v1 import tickwheel_pb2 as pb

log = logging.getLogger("tickwheel.client")

CONNECT_TIMEOUT_MS = 1_000
"""How long a new connection may take, handshake included (gRPC's default: 20 s). A call opened
on a connection to a stopped process (a paused node's kernel still accepts it) waited that
long; a handshake over a network takes milliseconds."""
MAX_RECONNECT_MS = 2_000
"""The longest wait between two attempts to reach a node that is down. gRPC's own grows to
2 minutes: a node back after a minute away (a pod rescheduled) stayed unreachable for 30 s
more, and a shard whose preferred leader it was took it back within 3 s (docs/shards.md)."""
KEEPALIVE_OPTIONS = (("grpc.keepalive_time_ms", 250), ("grpc.keepalive_timeout_ms", 500),
                     ("grpc.http2.ping_timeout_ms", 500),
                     ("grpc.http2.max_pings_without_data", 0),
                     ("grpc.min_reconnect_backoff_ms", CONNECT_TIMEOUT_MS),
                     ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_MS))
"""A paused or cut-off node (its TCP connections stay open) must not hold a consumer stream
past the election that replaces it (0.5-0.8 s): a connection with calls open pings 250 ms
after it last read anything, and breaks if the answer takes 500 ms. gRPC applies its own
``ping_timeout_ms`` (60 s) to keepalive pings unless it is set too, and stops pinging after
two pings without data unless ``max_pings_without_data`` is 0: without both, a stopped node
held its consumers until it resumed. Nodes accept pings at any rate. No ping covers a
connection's handshake: ``min_reconnect_backoff_ms`` bounds it (`CONNECT_TIMEOUT_MS`). A node
that was down is dialed again within `MAX_RECONNECT_MS` of its return."""
CHANNEL_OPTIONS = (("grpc.max_receive_message_length", 64 << 20),
                   ("grpc.max_send_message_length", 64 << 20), *KEEPALIVE_OPTIONS)
DEFAULT_TARGET = "127.0.0.1:7400"


CREDIT_BATCH_DIVISOR = 8
"""A consumer returns credits in batches of ``prefetch // CREDIT_BATCH_DIVISOR`` (at least 1)."""
ACK_LINGER_S = 0.025
"""How long a consumer stream's acks and nacks wait for others before they are sent, so that
one request carries many: a request per delivery batch made the leader spend more on gRPC
reads than on the messages, and the consumer as much on its writes (acks go to Raft with the
leader's next turn, so an ack sent sooner is applied no sooner). A slow rate's dispatch step
comes every 20 ms and its messages are handed out over that span: 25 ms takes a step's acks
in about one request (10 ms took two or three; at 1,000 msg/s the leader spent 7 % and the
clients 13 % less a message with 25). Credits due and the end of the stream go at once, and
take what waits with them."""


class Credits:
    """The credits a consumer owes the node for messages handed out, returned in batches of
    ``prefetch // CREDIT_BATCH_DIVISOR`` (at least 1): the node always holds at least
    ``prefetch - batch + 1`` of them, so it never waits on credits held back here, and a
    consumer at 1,000 messages a second sends a credit request a few times a second instead
    of one per delivery batch."""

    def __init__(self, prefetch: int) -> None:
        self.batch = max(1, prefetch // CREDIT_BATCH_DIVISOR)
        self.owed = 0

    def handed_out(self) -> int:
        """One more message handed to the application; the credits to send now (0: none)."""
        self.owed += 1
        if self.owed < self.batch:
            return 0
        owed, self.owed = self.owed, 0
        return owed

    def reset(self) -> None:
        """A new stream starts with the whole prefetch."""
        self.owed = 0


Queued = tuple[Literal["credit"], int] | tuple[Literal["ack", "nack"], str]
"""A consumer's request waiting to be sent: credits to grant, or a receipt to ack or nack (None
in its place ends the stream)."""


def urgent(item: Queued | None) -> bool:
    """Whether a queued consumer request goes at once (a credit batch, the stream's end)
    rather than waiting up to `ACK_LINGER_S` for company (an ack or a nack)."""
    return item is None or item[0] == "credit"

MAP_CHECK_S = 5.0
"""How often a consumer reads the shard map again, to open a stream to each shard a growth
adds (docs/shards.md)."""

@dataclass(slots=True)
class Received:
    """A delivered message. Call `ack` once it is handled, or `nack` if it could not be: it
    comes back (same id, ``attempt + 1``) after the next step of the node's retry ladder, or
    goes to ``%DLQ%<topic>`` after the last attempt. Neither within the visibility timeout
    counts as a nack."""

    id: str
    topic: str
    body: bytes
    properties: dict[str, str]
    deliver_at_ms: int
    delivered_at_ms: int
    attempt: int
    possible_duplicate: bool
    receipt: str
    handle: int
    node: str
    """The Raft address of the leader that sent it."""
    _send: Callable[[Literal["ack", "nack"], str], None] = field(repr=False)
    """``send(kind, receipt)``: queue an "ack" or a "nack" on the consumer's stream."""
    group: str = ""
    """The consumer group it was handed out to ("" : the topic's default group)."""
    hold_ms: int = 0
    """How long the consumer held it after it arrived before handing it out (the leader
    sent it ahead of its due time; `Arrivals`)."""

    @property
    def lateness_ms(self) -> int:
        return self.delivered_at_ms - self.deliver_at_ms

    def ack(self) -> None:
        self._send("ack", self.receipt)

    def nack(self) -> None:
        self._send("nack", self.receipt)


def received(response: pb.ReceiveResponse,
             send: Callable[[Literal["ack", "nack"], str], None]) -> list[Received]:
    return [Received(m.id, m.topic, m.body, dict(m.properties) if m.properties else {},
                     m.deliver_at_ms,
                     m.delivered_at_ms, m.attempt, m.possible_duplicate, m.receipt, m.handle,
                     m.node, send, m.group, m.hold_ms) for m in response.messages]


class Arrivals:
    """A consumer stream's messages received and not taken yet, in the order they may be taken.
    One the leader sent ahead of its due time (``Delivered.hold_ms``) is held for its
    ``hold_ms`` from the moment it arrived, on this host's monotonic clock: a clock set wrong
    here or on the leader cannot release it early. The others may be taken at once.

    Thread contract: `add` and `broke` may be called from one thread (the stream's reader)
    while another (the consumer's iterator) calls the rest: they only append to a deque."""

    def __init__(self, send: Callable[[Literal["ack", "nack"], str], None],
                 clock_s: Callable[[], float] = time.monotonic) -> None:
        self._send = send
        self._clock_s = clock_s
        self._incoming: deque[tuple[float, pb.ReceiveResponse] | None] = deque()
        """Responses not sorted yet, in order, and None where a stream broke."""
        self._ready: deque[Received] = deque()
        self._held: list[tuple[float, int, Received]] = []
        """A heap of ``(release time, arrival order, message)``."""
        self._order = itertools.count()

    def add(self, response: pb.ReceiveResponse) -> None:
        self._incoming.append((self._clock_s(), response))

    def broke(self) -> None:
        """The stream that brought what came so far ended, and another begins: what came
        before is dropped, held or not. Its leases ended with its stream, and the next lease
        of each message is flagged, so handing these out too would make an unflagged
        duplicate (the reader reconnects while messages are held: held ones do not keep it
        from reading)."""
        self._incoming.append(None)

    @property
    def waiting(self) -> bool:
        """Whether messages wait to be taken now (or to be sorted): a stream reads its next
        response once they are taken. Held messages do not count: the consumer's credits
        bound them."""
        return bool(self._ready) or bool(self._incoming)

    def take(self) -> Received | None:
        """The next message that may be taken now (None if none)."""
        if not self._ready:
            self.release()
        return self._ready.popleft() if self._ready else None

    def release(self) -> float | None:
        """Make the held messages whose hold ended ready; the seconds until the next one's
        hold ends (None if none is held)."""
        while self._incoming:
            item = self._incoming.popleft()
            if item is None:
                self._dropped(len(self._ready) + len(self._held), "reason=reconnected")
                continue
            arrived_s, response = item
            for message in received(response, self._send):
                if message.hold_ms:
                    heapq.heappush(self._held, (arrived_s + message.hold_ms / 1000,
                                                next(self._order), message))
                else:
                    self._ready.append(message)
        held = self._held
        if not held:
            return None
        now_s = self._clock_s()
        while held and held[0][0] <= now_s:
            self._ready.append(heapq.heappop(held)[2])
        return held[0][0] - now_s if held else None

    def __len__(self) -> int:
        return (len(self._ready) + len(self._held)
                + sum(len(item[1].messages) for item in self._incoming if item is not None))

    def drop(self, target: str) -> None:
        """Drop everything received, held or not: the stream from ``target`` that sent it
        ended (its leader stepped down or died), so it can no longer be acknowledged, and the
        new leader sends it again, flagged; handing it out too would make an unflagged
        duplicate."""
        count = len(self)
        self._incoming.clear()
        self._dropped(count, f"target={target}")

    def _dropped(self, count: int, context: str) -> None:
        """Drop what is sorted (ready and held), and say so when it was anything."""
        if count:
            log.info("event=consumer_dropped_buffered messages=%d %s", count, context)
        self._ready.clear()
        self._held.clear()


class Releasing(Protocol):
    """A shard stream as a consumer's iterator sees it (`Arrivals`' view of it)."""

    @property
    def waiting(self) -> bool: ...

    def release(self) -> float | None: ...


StreamT = TypeVar("StreamT", bound=Releasing)


def next_in_turn(streams: Sequence[StreamT], turn: int, wake: Callable[[], None]
                 ) -> tuple[StreamT | None, int, float | None]:
    """For a consumer's iterator, both kinds: the next of ``streams`` from ``turn`` with a
    message to take now (None if none), the turn after it, and how long until the first
    held message may be taken (None: none is held). ``wake`` (the readers' condition's
    ``notify_all``, with it held) is called when a stream's response turned out all held:
    its reader may read on."""
    held_s: float | None = None
    for offset in range(len(streams)):
        stream = streams[(turn + offset) % len(streams)]
        was_waiting = stream.waiting
        stream_held_s = stream.release()
        if stream.waiting:
            return stream, turn + offset + 1, held_s
        if was_waiting:
            wake()
        if stream_held_s is not None and (held_s is None or stream_held_s < held_s):
            held_s = stream_held_s
    return None, turn, held_s


def receive_request(topic: str, consumer: str, group: str, max_messages: int,
                    invisible_duration_ms: int, wait_ms: int) -> pb.ReceiveMessagesRequest:
    return pb.ReceiveMessagesRequest(topic=topic, group=group, consumer=consumer,
                                     max_messages=max_messages,
                                     invisible_duration_ms=invisible_duration_ms,
                                     wait_ms=wait_ms)


def settle_request(topic: str, group: str, receipts: Sequence[str],
                   invisible_duration_ms: int = 0) -> pb.SettleRequest:
    return pb.SettleRequest(topic=topic, group=group, receipts=receipts,
                            invisible_duration_ms=invisible_duration_ms)


def subscribe_request(topic: str, credits: int, visibility_timeout_ms: int,
                      name: str, group: str = "") -> pb.ReceiveRequest:
    return pb.ReceiveRequest(subscribe=pb.Subscribe(
        topic=topic, credits=credits, visibility_timeout_ms=visibility_timeout_ms,
        consumer=name, group=group, hold=True))


def with_credits(subscribe: pb.ReceiveRequest, credits: int) -> pb.ReceiveRequest:
    """``subscribe`` with ``credits`` to begin with (a shard stream's part of the prefetch)."""
    request = pb.ReceiveRequest()
    request.CopyFrom(subscribe)
    request.subscribe.credits = credits
    return request


def merged_requests(items: Iterable[Queued]) -> list[pb.ReceiveRequest]:
    """Queued ``("credit", n)``, ``("ack", receipt)`` and ``("nack", receipt)`` items as at most
    three requests."""
    credits = 0
    receipts: list[str] = []
    nacks: list[str] = []
    for item in items:
        if item[0] == "credit":
            credits += item[1]
        elif item[0] == "nack":
            nacks.append(item[1])
        else:
            receipts.append(item[1])
    requests = []
    if receipts:
        requests.append(pb.ReceiveRequest(ack=pb.Ack(receipts=receipts)))
    if nacks:
        requests.append(pb.ReceiveRequest(nack=pb.Nack(receipts=nacks)))
    if credits:
        requests.append(pb.ReceiveRequest(credit=pb.Credit(credits=credits)))
    return requests


# -- routing ----------------------------------------------------------------------------------

ChannelT = TypeVar("ChannelT", grpc.Channel, grpc.aio.Channel)


class ClientBase(Generic[ChannelT]):
    """What `Client` and `AsyncClient` hold alike: where to call (a `Router` per shard), with
    what `Credentials`, for how long, and a channel per node address."""

    def __init__(self, targets: str | Sequence[str], *, timeout_s: float,
                 attempt_timeout_s: float, credentials: Credentials | None) -> None:
        self._shards = ShardRouters(targets)
        self._credentials = Credentials.from_env() if credentials is None else credentials
        self._timeout_s = timeout_s
        self._attempt_timeout_s = attempt_timeout_s
        self._channels: dict[str, ChannelT] = {}

    @property
    def leader(self) -> str | None:
        """The leader's gRPC address (shard 0's, in a cluster of several shards), once a
        response has named it."""
        return self._shards.routers[0].leader

    def _learn(self, info: pb.ClusterInfoResponse) -> ShardRouters:
        """Take the shard map of a ``ClusterInfo`` answer."""
        self._shards.learn([(shard.grpc_addresses, shard.leader_grpc) for shard in info.shards],
                           info.map_version or 1)
        return self._shards

    def _unmapped(self, error: TickwheelClientError) -> ShardRouters:
        """The map when ``ClusterInfo`` failed: a server that does not implement it (a stand-in,
        a gateway that passes some methods) is taken as one shard; any other failure is
        raised."""
        if error.code != grpc.StatusCode.UNIMPLEMENTED:
            raise error
        self._shards.learn([])
        return self._shards


def stale_map(error: TickwheelClientError) -> bool:
    """Whether a node refused part of a request as another shard's: the client's shard map
    is not the cluster's (``FAILED_PRECONDITION``; docs/shards.md)."""
    return error.code == grpc.StatusCode.FAILED_PRECONDITION


class Reconnect(Exception):
    """A consumer stream broke in a way a new stream may fix."""
