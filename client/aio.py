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
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal, TypeVar

import grpc
from tenacity import AsyncRetrying

from tickwheel.client._core import (
    CHANNEL_OPTIONS,
    DEFAULT_TARGET,
    ClientBase,
    Received,
    receive_request,
    received,
    settle_request,
    stale_map,
    subscribe_request,
)
from tickwheel.client.aio_consumers import AsyncConsumer
from tickwheel.client.coalescing import AsyncCoalescer
from tickwheel.client.credentials import Credentials, open_aio_channel
from tickwheel.client.errors import TickwheelClientError, retryable, translate
from tickwheel.client.histogram import DueHistogram, due_histogram, histogram_request
from tickwheel.client.info import ClusterInfo, cluster_info
from tickwheel.client.messages import (
    CancelOutcome,
    Message,
    Rescheduled,
    Scheduled,
    cancel_outcomes,
    reschedule_request,
    reschedule_results,
    schedule_request,
    scheduled,
)
from tickwheel.client.receipts import ReceiptLog
from tickwheel.client.retries import retry_policy
from tickwheel.client.routing import ShardRouters, receive_slices, split
from tickwheel.client.rpcs import (
    ACK_MESSAGES,
    CANCEL,
    CHANGE_INVISIBLE_DURATION,
    CLUSTER_INFO,
    CREATE_GROUP,
    DELETE_GROUP,
    DUE_HISTOGRAM,
    RECEIVE_MESSAGES,
    RESCHEDULE,
    SCHEDULE,
    RequestT,
    ResponseT,
    Unary,
)
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.v1 import tickwheel_pb2_grpc as pb_grpc

log = logging.getLogger("tickwheel.client")

Answer = TypeVar("Answer")


class AsyncClient(ClientBase[grpc.aio.Channel]):
    """See `tickwheel.client.Client`; create and use it on one event loop. The parts of a
    request for several shards are sent at once."""

    def __init__(self, targets: str | Sequence[str] = DEFAULT_TARGET, *,
                 timeout_s: float = 30.0, attempt_timeout_s: float = 10.0,
                 credentials: Credentials | None = None) -> None:
        super().__init__(targets, timeout_s=timeout_s, attempt_timeout_s=attempt_timeout_s,
                         credentials=credentials)
        self._settling: set[asyncio.Task[list[bool]]] = set()
        self._receive_turn = 0
        self._stubs: dict[str, pb_grpc.TickwheelAsyncStub] = {}
        """One per channel: a stub builds a callable for every method of the service."""
        self._metadata = self._credentials.call_metadata()
        """The token, on every call (`open_aio_channel`'s channels carry none)."""
        self._coalescer = AsyncCoalescer(self.schedule_many)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._coalescer.wait_sent()
        if self._settling:
            await asyncio.gather(*self._settling, return_exceptions=True)
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._stubs.clear()

    async def schedule(self, topic: str, body: bytes | str, *, deliver_at_ms: int | None = None,
                       delay_ms: int | None = None, delay_level: int | None = None,
                       id: str | None = None, properties: Mapping[str, str] | None = None,
                       routing_key: str = "") -> Scheduled:
        """See `tickwheel.client.Client.schedule`: calls from several tasks at once share
        requests."""
        message = Message(topic, body, deliver_at_ms, delay_ms, properties=properties or {},
                          delay_level=delay_level, routing_key=routing_key,
                          **({"id": id} if id else {}))
        return await self._coalescer.schedule(message)

    async def schedule_many(self, messages: Iterable[Message]) -> list[Scheduled]:
        batch = list(messages)

        async def part(shard: int, positions: list[int]) -> list[Scheduled]:
            return scheduled(await self._call(
                SCHEDULE, schedule_request(batch[p] for p in positions), shard=shard))
        return await self._per_shard(
            lambda shards: [shards.shard_of_message(m.routing_key, m.id) for m in batch], part)

    async def cancel(self, handle: int) -> bool:
        return (await self.cancel_many([handle]))[0]

    async def cancel_many(self, handles: Sequence[int]) -> list[bool]:
        return [outcome.cancelled for outcome in await self.cancel_outcomes(handles)]

    async def cancel_outcomes(self, handles: Sequence[int]) -> list[CancelOutcome]:
        async def part(shard: int, positions: list[int]) -> list[CancelOutcome]:
            return cancel_outcomes(await self._call(
                CANCEL, pb.CancelRequest(handles=[handles[p] for p in positions]),
                shard=shard))
        return await self._per_shard(lambda shards: list(map(shards.shard_of_handle, handles)),
                                     part)

    async def reschedule(self, handles: Sequence[int], *, deliver_at_ms: int | None = None,
                         delay_ms: int | None = None) -> list[Rescheduled]:
        """See `tickwheel.client.Client.reschedule`."""
        reschedule_request([], deliver_at_ms, delay_ms)  # checks the times before any call

        async def part(shard: int, positions: list[int]) -> list[Rescheduled]:
            return reschedule_results(await self._call(RESCHEDULE, reschedule_request(
                [handles[p] for p in positions], deliver_at_ms, delay_ms), shard=shard))
        return await self._per_shard(lambda shards: list(map(shards.shard_of_handle, handles)),
                                     part)

    async def cluster_info(self) -> ClusterInfo:
        return cluster_info(await self._call(CLUSTER_INFO, pb.ClusterInfoRequest()))

    async def due_histogram(self, span: str = "minute", shard: int = 0, topic: str = ""
                            ) -> DueHistogram:
        """See `tickwheel.client.Client.due_histogram`."""
        return due_histogram(await self._call(DUE_HISTOGRAM, histogram_request(span, topic),
                                              shard=shard), topic)

    async def shards(self) -> ShardRouters:
        """See `tickwheel.client.Client.shards`."""
        shards = self._shards
        if not shards.known:
            try:
                shards = self._learn(await self._call(CLUSTER_INFO, pb.ClusterInfoRequest()))
            except TickwheelClientError as error:
                shards = self._unmapped(error)
        return shards

    async def refresh_shards(self) -> ShardRouters:
        """See `tickwheel.client.Client.refresh_shards`."""
        return self._learn(await self._call(CLUSTER_INFO, pb.ClusterInfoRequest()))

    def consume(self, topic: str, *, prefetch: int = 64, visibility_timeout_ms: int = 0,
                name: str = "", group: str = "",
                receipts_dir: Path | str | None = None) -> AsyncConsumer:
        """See `tickwheel.client.Client.consume`."""
        receipts = None if receipts_dir is None else ReceiptLog(receipts_dir, name)
        return AsyncConsumer(self, subscribe_request(topic, prefetch, visibility_timeout_ms,
                                                     name, group), prefetch, receipts)

    async def receive(self, topic: str, *, consumer: str, group: str = "",
                      max_messages: int = 16, invisible_duration_ms: int = 0,
                      wait_ms: int = 5_000) -> list[Received]:
        """See `tickwheel.client.Client.receive`. ``ack()`` and ``nack()`` of what it returns
        settle in the background (`close` waits for them); await `ack_receipts` to know."""
        count = (await self.shards()).count
        self._receive_turn += 1
        response = pb.ReceiveResponse()
        for shard, slice_ms in receive_slices(count, self._receive_turn, wait_ms):
            response = await self._call(RECEIVE_MESSAGES, receive_request(
                topic, consumer, group, max_messages, invisible_duration_ms, slice_ms),
                timeout_s=slice_ms / 1000 + self._attempt_timeout_s, shard=shard)
            if response.messages:
                break

        def settle(kind: Literal["ack", "nack"], receipt: str) -> None:
            task = asyncio.ensure_future(
                self.ack_receipts(topic, group, [receipt]) if kind == "ack"
                else self.change_invisible_duration(topic, group, [receipt], 0))
            self._settling.add(task)
            task.add_done_callback(self._settled)
        return received(response, settle)

    def _settled(self, task: asyncio.Task[list[bool]]) -> None:
        self._settling.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("event=settle_failed error=%r", task.exception())

    async def ack_receipts(self, topic: str, group: str, receipts: Sequence[str]
                           ) -> list[bool]:
        return await self._settle(ACK_MESSAGES, topic, group, receipts, 0)

    async def change_invisible_duration(self, topic: str, group: str, receipts: Sequence[str],
                                        invisible_duration_ms: int) -> list[bool]:
        return await self._settle(CHANGE_INVISIBLE_DURATION, topic, group, receipts,
                                  invisible_duration_ms)

    async def create_group(self, topic: str, group: str) -> bool:
        """See `tickwheel.client.Client.create_group`."""
        request = pb.GroupRequest(topic=topic, group=group)
        count = (await self.shards()).count
        answers = await asyncio.gather(*(self._call(CREATE_GROUP, request, shard=shard)
                                         for shard in range(count)))
        return all(answer.existed for answer in answers)

    async def delete_group(self, topic: str, group: str) -> bool:
        """See `tickwheel.client.Client.delete_group`."""
        request = pb.GroupRequest(topic=topic, group=group)
        count = (await self.shards()).count
        answers = await asyncio.gather(*(self._call(DELETE_GROUP, request, shard=shard)
                                         for shard in range(count)))
        return any(answer.existed for answer in answers)

    # -- plumbing -------------------------------------------------------------------------

    async def _settle(self, rpc: Unary[pb.SettleRequest, pb.SettleResponse], topic: str,
                      group: str, receipts: Sequence[str], invisible_duration_ms: int
                      ) -> list[bool]:
        async def part(shard: int, positions: list[int]) -> list[bool]:
            return list((await self._call(rpc, settle_request(
                topic, group, [receipts[p] for p in positions], invisible_duration_ms),
                shard=shard)).settled)
        return await self._per_shard(
            lambda shards: list(map(shards.shard_of_receipt, receipts)), part)

    async def _per_shard(self, place: Callable[[ShardRouters], list[int]],
                         call: Callable[[int, list[int]], Awaitable[list[Answer]]]
                         ) -> list[Answer]:
        """See `tickwheel.client.Client._per_shard`; the parts are sent at once."""
        where = place(await self.shards())
        if not where:  # nothing to place: the node answers what is wrong with the request
            return await call(0, [])
        answers: dict[int, Answer] = {}
        todo = list(range(len(where)))
        for attempt in range(2):
            parts = [[todo[i] for i in positions]
                     for positions in split(where[p] for p in todo).values()]
            shards = [where[chosen[0]] for chosen in parts]
            results = await asyncio.gather(*(call(shard, chosen)
                                             for shard, chosen in zip(shards, parts, strict=True)),
                                           return_exceptions=True)
            stale: list[int] = []
            for chosen, result in zip(parts, results, strict=True):
                if isinstance(result, BaseException):
                    if not (isinstance(result, TickwheelClientError) and stale_map(result)
                            and not attempt):
                        raise result
                    stale += chosen
                else:
                    answers.update(zip(chosen, result, strict=True))
            if not stale:
                break
            self._shards.known = False
            todo, where = stale, place(await self.shards())
        return [answers[p] for p in range(len(where))]

    def _stub(self, address: str) -> pb_grpc.TickwheelAsyncStub:
        stub = self._stubs.get(address)
        if stub is None:
            channel = self._channels[address] = open_aio_channel(
                address, self._credentials, CHANNEL_OPTIONS)
            stub = self._stubs[address] = pb_grpc.TickwheelStub(channel)
        return stub

    async def _call(self, rpc: Unary[RequestT, ResponseT], request: RequestT,
                    timeout_s: float | None = None, shard: int = 0) -> ResponseT:
        async def attempt() -> ResponseT:  # a coroutine function: tenacity awaits its calls
            return await self._attempt(rpc, request, timeout_s, shard)
        try:
            return await AsyncRetrying(**retry_policy(self._timeout_s))(attempt)
        except grpc.RpcError as error:
            raise translate(error) from None

    async def _learn_leader(self, shard: int) -> None:
        """Ask a node who leads, once, before a stream opens while no answer has named the
        leader: a stream opened on a follower is proxied, a hop and the follower's CPU for every
        message. Best effort: if no node answers, the stream opens where the router says."""
        with contextlib.suppress(grpc.RpcError):
            await self._attempt(CLUSTER_INFO, pb.ClusterInfoRequest(), shard=shard)

    async def _attempt(self, rpc: Unary[RequestT, ResponseT], request: RequestT,
                       timeout_s: float | None = None, shard: int = 0) -> ResponseT:
        router = self._shards.routers[shard]
        address = router.choose()
        method: grpc.aio.UnaryUnaryMultiCallable[RequestT, ResponseT] = getattr(
            self._stub(address), rpc.name)
        call = method(request, timeout=timeout_s or self._attempt_timeout_s,
                      metadata=self._metadata)
        try:
            response = await call
        except grpc.aio.AioRpcError as error:
            metadata = error.trailing_metadata()
            router.observe(metadata)
            if retryable(error):
                router.failed(address, metadata)
            raise
        router.observe(await call.trailing_metadata())
        return response
