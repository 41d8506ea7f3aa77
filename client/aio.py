"""The asyncio client: the same calls as `tickwheel.client.Client`, awaited.

::

    from tickwheel.client import AsyncClient

    async with AsyncClient("127.0.0.1:7400") as client:
        await client.schedule("orders", b"close #42", delay_ms=30 * 60_000, id="order-42")
        async with client.consume("orders") as consumer:
            async for message in consumer:
                await handle(message.body)
                message.ack()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Iterable, Mapping, Sequence

import grpc
from tenacity import AsyncRetrying, retry_if_exception_type

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
    translate,
    urgent,
)
from tickwheel.client.credentials import Credentials, open_aio_channel
from tickwheel.client.info import ClusterInfo, cluster_info
from tickwheel.client.routing import Router
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.v1 import tickwheel_pb2_grpc as pb_grpc

log = logging.getLogger("tickwheel.client")


class AsyncClient:
    """See `tickwheel.client.Client`; create and use it on one event loop."""

    def __init__(self, targets: str | Sequence[str] = DEFAULT_TARGET, *,
                 timeout_s: float = 30.0, attempt_timeout_s: float = 10.0,
                 credentials: Credentials | None = None) -> None:
        self._router = Router(targets)
        self._credentials = Credentials.from_env() if credentials is None else credentials
        self._timeout_s = timeout_s
        self._attempt_timeout_s = attempt_timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._settling: set[asyncio.Task] = set()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._settling:
            await asyncio.gather(*self._settling, return_exceptions=True)
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    @property
    def leader(self) -> str | None:
        return self._router.leader

    async def schedule(self, topic: str, body: bytes | str, *, deliver_at_ms: int | None = None,
                       delay_ms: int | None = None, delay_level: int | None = None,
                       id: str | None = None,
                       properties: Mapping[str, str] | None = None) -> Scheduled:
        message = Message(topic, body, deliver_at_ms, delay_ms, properties=properties or {},
                          delay_level=delay_level, **({"id": id} if id else {}))
        return (await self.schedule_many([message]))[0]

    async def schedule_many(self, messages: Iterable[Message]) -> list[Scheduled]:
        request = schedule_request(messages)
        return scheduled(await self._call("Schedule", request))

    async def cancel(self, handle: int) -> bool:
        return (await self.cancel_many([handle]))[0]

    async def cancel_many(self, handles: Sequence[int]) -> list[bool]:
        return [outcome.cancelled for outcome in await self.cancel_outcomes(handles)]

    async def cancel_outcomes(self, handles: Sequence[int]) -> list[CancelOutcome]:
        return cancel_outcomes(await self._call("Cancel", pb.CancelRequest(handles=handles)))

    async def reschedule(self, handles: Sequence[int], *, deliver_at_ms: int | None = None,
                         delay_ms: int | None = None) -> list[Rescheduled]:
        """See `tickwheel.client.Client.reschedule`."""
        return reschedule_results(await self._call(
            "Reschedule", reschedule_request(handles, deliver_at_ms, delay_ms)))

    async def cluster_info(self) -> ClusterInfo:
        return cluster_info(await self._call("ClusterInfo", pb.ClusterInfoRequest()))

    def consume(self, topic: str, *, prefetch: int = 64, visibility_timeout_ms: int = 0,
                name: str = "", group: str = "") -> AsyncConsumer:
        return AsyncConsumer(self, topic, prefetch, visibility_timeout_ms, name, group)

    async def receive(self, topic: str, *, consumer: str, group: str = "",
                      max_messages: int = 16, invisible_duration_ms: int = 0,
                      wait_ms: int = 5_000) -> list[Received]:
        """See `tickwheel.client.Client.receive`. ``ack()`` and ``nack()`` of what it returns
        settle in the background (`close` waits for them); await `ack_receipts` to know."""
        response = await self._call("ReceiveMessages", receive_request(
            topic, consumer, group, max_messages, invisible_duration_ms, wait_ms),
            timeout_s=wait_ms / 1000 + self._attempt_timeout_s)

        def settle(kind: str, receipt: str) -> None:
            task = asyncio.ensure_future(
                self.ack_receipts(topic, group, [receipt]) if kind == "ack"
                else self.change_invisible_duration(topic, group, [receipt], 0))
            self._settling.add(task)
            task.add_done_callback(self._settled)
        return received(response, settle)

    def _settled(self, task: asyncio.Task) -> None:
        self._settling.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("event=settle_failed error=%r", task.exception())

    async def ack_receipts(self, topic: str, group: str, receipts: Sequence[str]
                           ) -> list[bool]:
        return list((await self._call("AckMessages",
                                      settle_request(topic, group, receipts))).settled)

    async def change_invisible_duration(self, topic: str, group: str, receipts: Sequence[str],
                                        invisible_duration_ms: int) -> list[bool]:
        return list((await self._call("ChangeInvisibleDuration", settle_request(
            topic, group, receipts, invisible_duration_ms))).settled)

    async def create_group(self, topic: str, group: str) -> bool:
        """See `tickwheel.client.Client.create_group`."""
        request = pb.GroupRequest(topic=topic, group=group)
        return bool((await self._call("CreateGroup", request)).existed)

    async def delete_group(self, topic: str, group: str) -> bool:
        """See `tickwheel.client.Client.delete_group`."""
        request = pb.GroupRequest(topic=topic, group=group)
        return bool((await self._call("DeleteGroup", request)).existed)

    # -- plumbing -------------------------------------------------------------------------

    def _stub(self, address: str) -> pb_grpc.TickwheelStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_aio_channel(
                address, self._credentials, CHANNEL_OPTIONS)
        return pb_grpc.TickwheelStub(channel)

    async def _call(self, method: str, request: object, timeout_s: float | None = None
                    ) -> object:
        try:
            async for attempt in AsyncRetrying(**retry_policy(self._timeout_s)):
                with attempt:
                    return await self._attempt(method, request, timeout_s)
        except grpc.RpcError as error:
            raise translate(error) from None

    async def _learn_leader(self) -> None:
        """Ask a node who leads, once, before a stream opens while no answer has named the
        leader: a stream opened on a follower is proxied, a hop and the follower's CPU for every
        message. Best effort: if no node answers, the stream opens where the router says."""
        with contextlib.suppress(grpc.RpcError):
            await self._attempt("ClusterInfo", pb.ClusterInfoRequest())

    async def _attempt(self, method: str, request: object, timeout_s: float | None = None
                       ) -> object:
        address = self._router.choose()
        call = getattr(self._stub(address), method)(
            request, timeout=timeout_s or self._attempt_timeout_s)
        try:
            response = await call
        except grpc.aio.AioRpcError as error:
            self._router.observe(error.trailing_metadata())
            if retryable(error):
                self._router.failed(address)
            raise
        self._router.observe(await call.trailing_metadata())
        return response


class _Reconnect(Exception):
    """The consumer stream broke in a way a new stream may fix."""


class AsyncConsumer:
    """An async iterator of `Received` messages; reconnects like `tickwheel.client.Consumer`."""

    def __init__(self, client: AsyncClient, topic: str, prefetch: int,
                 visibility_timeout_ms: int, name: str, group: str = "") -> None:
        self._client = client
        self._subscribe = subscribe_request(topic, prefetch, visibility_timeout_ms, name, group)
        self._buffer: deque[Received] = deque()
        self._credits = Credits(prefetch)
        self._pending: list[tuple[str, object]] = []
        self._wakeup = asyncio.Event()
        self._flush = asyncio.Event()
        """Something queued goes at once (`urgent`), and takes the acks waiting with it."""
        self._call: grpc.aio.StreamStreamCall | None = None
        self._writer: asyncio.Task | None = None
        self._closed = False

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> AsyncConsumer:
        return self

    async def __anext__(self) -> Received:
        if self._buffer and self._call is not None and self._call.done():
            # As in the sync consumer: what a finished stream sent can no longer be
            # acknowledged, and the new leader sends it again, flagged.
            log.info("event=consumer_dropped_buffered messages=%d target=%s",
                     len(self._buffer), self._address)
            self._buffer.clear()
            self._drop_stream()
        while not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            await self._receive()
        if credits := self._credits.handed_out():
            self._queue(("credit", credits))
        return self._buffer.popleft()

    async def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued (acks), end the stream, and wait up to ``timeout_s`` for the
        node to close it; messages still on their way are redelivered to other consumers."""
        self._closed = True
        call = self._call
        if call is not None:
            self._queue(("end", None))
            try:
                await asyncio.wait_for(call.wait_for_connection(), timeout_s)
                await asyncio.wait_for(call.code(), timeout_s)
            except (TimeoutError, grpc.RpcError):
                pass
        self._drop_stream()

    def _send(self, kind: str, receipt: str) -> None:
        self._queue((kind, receipt))

    def _queue(self, item: tuple[str, object]) -> None:
        self._pending.append(item)
        self._wakeup.set()
        if urgent(item):
            self._flush.set()

    def _drop_stream(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
        if self._call is not None:
            self._call.cancel()
        self._call = self._writer = None

    async def _receive(self) -> None:
        async for attempt in AsyncRetrying(retry=retry_if_exception_type(_Reconnect),
                                           wait=RECONNECT_WAIT, reraise=True):
            with attempt:
                if self._closed:
                    return
                if self._call is None:
                    if self._client._router.leader is None:
                        await self._client._learn_leader()
                    self._connect()
                await self._read_one()

    def _connect(self) -> None:
        self._address = self._client._router.choose()
        self._call = self._client._stub(self._address).Receive()
        self._pending.clear()
        self._credits.reset()
        self._writer = asyncio.create_task(self._write(self._call))

    async def _write(self, call: grpc.aio.StreamStreamCall) -> None:
        """Send the subscription, then credits and acks as they queue up. A broken stream
        ends this; the reader notices and reconnects."""
        try:
            await call.write(self._subscribe)
            while True:
                await self._wakeup.wait()
                if not self._flush.is_set():  # acks wait up to ACK_LINGER_S for company
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._flush.wait(), ACK_LINGER_S)
                self._wakeup.clear()
                self._flush.clear()
                items, self._pending = self._pending, []
                for request in merged_requests(i for i in items if i[0] != "end"):
                    await call.write(request)
                if any(kind == "end" for kind, _ in items):
                    await call.done_writing()
                    return
        except (grpc.RpcError, asyncio.InvalidStateError):
            return

    async def _read_one(self) -> None:
        call = self._call
        try:
            response = await call.read()
        except grpc.aio.AioRpcError as error:
            self._drop_stream()
            if self._closed:
                return
            if not retryable(error):
                raise translate(error) from None
            self._client._router.observe(error.trailing_metadata())
            self._client._router.failed(self._address)
            log.info("event=consumer_reconnect target=%s code=%s", self._address,
                     error.code().name)
            raise _Reconnect from error
        if response is grpc.aio.EOF:
            self._drop_stream()
            raise _Reconnect
        self._buffer.extend(received(response, self._send))
