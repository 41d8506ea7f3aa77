"""The blocking client.

::

    from tickwheel.client import Client

    with Client("127.0.0.1:7400") as client:
        result = client.schedule("orders", b"close #42", delay_ms=30 * 60_000,
                                 id="order-42-timeout")
        with client.consume("orders") as consumer:
            for message in consumer:
                handle(message.body)
                message.ack()
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence

import grpc
from tenacity import Retrying, retry_if_exception_type

from tickwheel.client._core import (
    ACK_LINGER_S,
    CHANNEL_OPTIONS,
    DEFAULT_TARGET,
    RECONNECT_WAIT,
    CancelOutcome,
    Credits,
    Message,
    Received,
    Rescheduled,
    Scheduled,
    cancel_outcomes,
    merged_requests,
    receive_request,
    received,
    reschedule_request,
    reschedule_results,
    retry_policy,
    retryable,
    schedule_request,
    scheduled,
    settle_request,
    subscribe_request,
    trailers,
    translate,
    urgent,
)
from tickwheel.client.credentials import Credentials, open_channel
from tickwheel.client.info import ClusterInfo, cluster_info
from tickwheel.client.routing import Router
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.v1 import tickwheel_pb2_grpc as pb_grpc

log = logging.getLogger("tickwheel.client")


class Client:
    """Talks to a tickwheel cluster through any of ``targets`` (``host:port``, or a
    comma-separated list), and to the leader once it knows it. Every call is retried with
    jittered back-off on ``UNAVAILABLE`` and leader changes for up to ``timeout_s``."""

    def __init__(self, targets: str | Sequence[str] = DEFAULT_TARGET, *,
                 timeout_s: float = 30.0, attempt_timeout_s: float = 10.0,
                 credentials: Credentials | None = None) -> None:
        self._router = Router(targets)
        self._credentials = Credentials.from_env() if credentials is None else credentials
        self._timeout_s = timeout_s
        self._attempt_timeout_s = attempt_timeout_s
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()

    @property
    def leader(self) -> str | None:
        """The leader's gRPC address, once a response has named it."""
        return self._router.leader

    def schedule(self, topic: str, body: bytes | str, *, deliver_at_ms: int | None = None,
                 delay_ms: int | None = None, delay_level: int | None = None,
                 id: str | None = None,
                 properties: Mapping[str, str] | None = None) -> Scheduled:
        """Schedule one message; give exactly one of ``deliver_at_ms``, ``delay_ms`` and
        ``delay_level``."""
        message = Message(topic, body, deliver_at_ms, delay_ms, properties=properties or {},
                          delay_level=delay_level, **({"id": id} if id else {}))
        return self.schedule_many([message])[0]

    def schedule_many(self, messages: Iterable[Message]) -> list[Scheduled]:
        """Schedule a batch in one request (one Raft entry, usually)."""
        request = schedule_request(messages)
        return scheduled(self._call("Schedule", request))

    def cancel(self, handle: int) -> bool:
        """Whether the message is cancelled (by this call or an earlier one): it will not be
        delivered from now on. False means it was already delivered and acked."""
        return self.cancel_many([handle])[0]

    def cancel_many(self, handles: Sequence[int]) -> list[bool]:
        return [outcome.cancelled for outcome in self.cancel_outcomes(handles)]

    def cancel_outcomes(self, handles: Sequence[int]) -> list[CancelOutcome]:
        """Per handle, what the cancel did, telling a first cancel from a repeated one."""
        return cancel_outcomes(self._call("Cancel", pb.CancelRequest(handles=handles)))

    def reschedule(self, handles: Sequence[int], *, deliver_at_ms: int | None = None,
                   delay_ms: int | None = None) -> list[Rescheduled]:
        """Move pending messages to ``deliver_at_ms``, or ``delay_ms`` from now on the leader's
        clock (0: now); per handle, what that did. The handles stay valid. Safe to repeat."""
        return reschedule_results(self._call(
            "Reschedule", reschedule_request(handles, deliver_at_ms, delay_ms)))

    def cluster_info(self, target: str | None = None) -> ClusterInfo:
        """What one node (``target``, else any) says about the cluster."""
        if target is None:
            return cluster_info(self._call("ClusterInfo", pb.ClusterInfoRequest()))
        try:
            return cluster_info(self._stub(target).ClusterInfo(pb.ClusterInfoRequest(),
                                                               timeout=self._attempt_timeout_s))
        except grpc.RpcError as error:
            raise translate(error) from None

    def consume(self, topic: str, *, prefetch: int = 64, visibility_timeout_ms: int = 0,
                name: str = "", group: str = "") -> Consumer:
        """Iterate over the due messages of ``topic`` as a consumer of ``group`` (created if
        new; "" is the topic's default group), competing with the group's other consumers:
        every group gets every message. ``prefetch`` messages may be on their way at once."""
        return Consumer(self, topic, prefetch, visibility_timeout_ms, name, group)

    def receive(self, topic: str, *, consumer: str, group: str = "", max_messages: int = 16,
                invisible_duration_ms: int = 0, wait_ms: int = 5_000) -> list[Received]:
        """Receive without a stream: up to ``max_messages`` due messages, waiting up to
        ``wait_ms`` for the first. Each stays leased to you until acked (`Received.ack`, or
        `ack_receipts` from anywhere) or until ``invisible_duration_ms`` (0: the node's
        default) passes; then it comes back as a retry. Calls naming one ``consumer`` share
        it."""
        response = self._call("ReceiveMessages", receive_request(
            topic, consumer, group, max_messages, invisible_duration_ms, wait_ms),
            timeout_s=wait_ms / 1000 + self._attempt_timeout_s)

        def settle(kind: str, receipt: str) -> None:
            if kind == "ack":
                self.ack_receipts(topic, group, [receipt])
            else:
                self.change_invisible_duration(topic, group, [receipt], 0)
        return received(response, settle)

    def ack_receipts(self, topic: str, group: str, receipts: Sequence[str]) -> list[bool]:
        """Per receipt, whether it acked a current lease of the group."""
        return list(self._call("AckMessages", settle_request(topic, group, receipts)).settled)

    def change_invisible_duration(self, topic: str, group: str, receipts: Sequence[str],
                                  invisible_duration_ms: int) -> list[bool]:
        """Move the leases' deadlines to ``invisible_duration_ms`` from now (0: retry now);
        per receipt, whether it named a current lease of the group."""
        return list(self._call("ChangeInvisibleDuration", settle_request(
            topic, group, receipts, invisible_duration_ms)).settled)

    def create_group(self, topic: str, group: str) -> bool:
        """Create a consumer group (messages coming due from now on wait for it); whether it
        existed already."""
        request = pb.GroupRequest(topic=topic, group=group)
        return bool(self._call("CreateGroup", request).existed)

    def delete_group(self, topic: str, group: str) -> bool:
        """Delete a consumer group and what waits in it; whether it existed."""
        request = pb.GroupRequest(topic=topic, group=group)
        return bool(self._call("DeleteGroup", request).existed)

    # -- plumbing -------------------------------------------------------------------------

    def _stub(self, address: str) -> pb_grpc.TickwheelStub:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = open_channel(
                    address, self._credentials, CHANNEL_OPTIONS)
        return pb_grpc.TickwheelStub(channel)

    def _call(self, method: str, request: object, timeout_s: float | None = None) -> object:
        try:
            for attempt in Retrying(**retry_policy(self._timeout_s)):
                with attempt:
                    return self._attempt(method, request, timeout_s)
        except grpc.RpcError as error:
            raise translate(error) from None

    def _attempt(self, method: str, request: object, timeout_s: float | None = None
                 ) -> object:
        address = self._router.choose()
        try:
            response, call = getattr(self._stub(address), method).with_call(
                request, timeout=timeout_s or self._attempt_timeout_s)
        except grpc.RpcError as error:
            self._router.observe(trailers(error))
            if retryable(error):
                self._router.failed(address)
                log.debug("event=retry method=%s target=%s code=%s", method, address,
                          error.code().name)
            raise
        self._router.observe(call.trailing_metadata())
        return response

    def _open_stream(self, requests: Iterator[pb.ReceiveRequest]
                     ) -> tuple[str, grpc.Call]:
        if self._router.leader is None:
            self._learn_leader()
        address = self._router.choose()
        return address, self._stub(address).Receive(requests)

    def _learn_leader(self) -> None:
        """Ask a node who leads, once, before a stream opens while no answer has named the
        leader: a stream opened on a follower is proxied, a hop and the follower's CPU for every
        message. Best effort: if no node answers, the stream opens where the router says."""
        with contextlib.suppress(grpc.RpcError):
            self._attempt("ClusterInfo", pb.ClusterInfoRequest())

    def _route_failed(self, address: str, error: grpc.RpcError) -> None:
        self._router.observe(trailers(error))
        self._router.failed(address)


class _Reconnect(Exception):
    """The consumer stream broke in a way a new stream may fix."""


class Consumer:
    """An iterator of `Received` messages from one topic. Reconnects (to the leader, with
    back-off) whenever the stream breaks, for as long as it is iterated; messages in flight on
    a broken stream come back from the new leader, flagged ``possible_duplicate``."""

    def __init__(self, client: Client, topic: str, prefetch: int, visibility_timeout_ms: int,
                 name: str, group: str = "") -> None:
        self._client = client
        self._subscribe = subscribe_request(topic, prefetch, visibility_timeout_ms, name, group)
        self._credits = Credits(prefetch)
        self._buffer: deque[Received] = deque()
        self._requests: queue.Queue = queue.Queue()
        self._stream: grpc.Call | None = None
        self._read_lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Consumer:
        return self

    def __next__(self) -> Received:
        stream = self._stream
        if self._buffer and stream is not None and stream.done():
            self._drop_buffered()
        while not self._buffer:
            if self._closed:
                raise StopIteration
            self._receive()
        message = self._buffer.popleft()
        if credits := self._credits.handed_out():
            self._requests.put(("credit", credits))
        return message

    def _drop_buffered(self) -> None:
        """The stream ended (its leader stepped down or died) while messages it sent wait
        here: they can no longer be acknowledged, and the new leader sends them again
        (flagged), so handing these out too would make an unflagged duplicate."""
        log.info("event=consumer_dropped_buffered messages=%d target=%s", len(self._buffer),
                 self._address)
        self._buffer.clear()
        with self._read_lock:
            self._stream = None

    def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued (acks), end the stream, and wait up to ``timeout_s`` for the
        node to close it; messages still on their way are redelivered to other consumers.
        Safe to call from another thread while one iterates."""
        self._closed = True
        self._requests.put(None)
        stream = self._stream
        if stream is None:
            return
        deadline = threading.Timer(timeout_s, stream.cancel)
        deadline.start()
        try:
            # One reader at a time: a thread blocked in next() sees the end (or the cancel)
            # first; then whatever is left is drained here.
            with self._read_lock:
                self._stream = None
                for _ in stream:
                    pass
        except grpc.RpcError:
            pass
        finally:
            deadline.cancel()

    def _send(self, kind: str, receipt: str) -> None:
        self._requests.put((kind, receipt))

    def _receive(self) -> None:
        """Wait for the next batch, (re)connecting as needed."""
        for attempt in Retrying(retry=retry_if_exception_type(_Reconnect),
                                wait=RECONNECT_WAIT, reraise=True):
            with attempt, self._read_lock:
                if self._closed:
                    return
                if self._stream is None:
                    self._connect()
                self._read_one()

    def _connect(self) -> None:
        self._requests.put(None)  # ends the request generator of the previous stream
        self._requests = queue.Queue()
        self._credits.reset()
        if self._closed:  # closed from another thread since the check: end the new stream too
            self._requests.put(None)
        self._address, self._stream = self._client._open_stream(self._outgoing(self._requests))

    def _read_one(self) -> None:
        try:
            response = next(self._stream)
        except StopIteration:
            self._stream = None
            raise _Reconnect from None
        except grpc.RpcError as error:
            self._stream = None
            if self._closed:
                return
            if not retryable(error):
                raise translate(error) from None
            self._client._route_failed(self._address, error)
            log.info("event=consumer_reconnect target=%s code=%s", self._address,
                     error.code().name)
            raise _Reconnect from error
        self._buffer.extend(received(response, self._send))

    def _outgoing(self, requests: queue.Queue) -> Iterator[pb.ReceiveRequest]:
        yield self._subscribe
        while True:
            item = requests.get()
            if item is None:
                return
            items = [item]
            # Acks wait up to ACK_LINGER_S for company; a credit batch or the end takes them.
            linger_until = time.monotonic() + ACK_LINGER_S
            while not urgent(items[-1]):
                try:
                    items.append(requests.get(timeout=max(0.0, linger_until
                                                          - time.monotonic())))
                except queue.Empty:
                    break
            while items[-1] is not None:
                try:
                    items.append(requests.get_nowait())
                except queue.Empty:
                    break
            yield from merged_requests(i for i in items if i is not None)
            if items[-1] is None:
                return
