"""The asyncio client's consumer: a stream per shard, merged (as the blocking client's,
`tickwheel.client.consumers`, with a task per shard instead of a thread)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Literal, Protocol

import grpc
from tenacity import AsyncRetrying, retry_if_exception_type

from tickwheel.client._core import (
    ACK_LINGER_S,
    MAP_CHECK_S,
    Arrivals,
    Credits,
    Queued,
    Received,
    Reconnect,
    merged_requests,
    next_in_turn,
    urgent,
    with_credits,
)
from tickwheel.client.errors import TickwheelClientError, retryable, translate
from tickwheel.client.receipts import ReceiptLog
from tickwheel.client.retries import CONSUMER_WAIT
from tickwheel.client.routing import ShardRouters
from tickwheel.client.shards import shard_prefetch
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.v1 import tickwheel_pb2_grpc as pb_grpc

log = logging.getLogger("tickwheel.client")

_Stream = grpc.aio.StreamStreamCall[pb.ReceiveRequest, pb.ReceiveResponse]
"""The consumer's stream: subscription, credits and acks out; messages in."""


class AsyncStreamClient(Protocol):
    """What a consumer asks of `tickwheel.client.AsyncClient`."""

    _shards: ShardRouters
    _metadata: tuple[tuple[str, str], ...]
    """What every call carries (the token)."""

    async def shards(self) -> ShardRouters: ...

    async def refresh_shards(self) -> ShardRouters: ...

    async def _learn_leader(self, shard: int) -> None: ...

    def _stub(self, address: str) -> pb_grpc.TickwheelAsyncStub: ...


class AsyncConsumer:
    """An async iterator of `Received` messages of one topic, from every shard; see
    `tickwheel.client.Consumer`."""

    def __init__(self, client: AsyncStreamClient, subscribe: pb.ReceiveRequest,
                 prefetch: int, receipts: ReceiptLog | None = None) -> None:
        self._client = client
        self._receipts = receipts
        self._subscribe = subscribe
        self._prefetch = prefetch
        self._streams: list[AsyncShardStream] | None = None
        self._ready = asyncio.Condition()
        self._readers: list[asyncio.Task[None]] = []
        self._turn = 0
        self._held_s: float | None = None
        self._failure: BaseException | None = None
        self._closed = False

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> AsyncConsumer:
        return self

    async def __anext__(self) -> Received:
        if self._streams is None:
            await self._open()
        async with self._ready:
            while True:
                stream = self._waiting(self._streams)
                if stream is not None:
                    message = stream.take()
                    self._ready.notify_all()  # its reader may read on once it is emptied
                    if message is not None:
                        if self._receipts is not None:
                            self._receipts.record(message)
                        return message
                    continue
                if self._failure is not None:
                    raise self._failure
                if self._closed:
                    raise StopAsyncIteration
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._held_s):
                        await self._ready.wait()

    async def close(self, timeout_s: float = 2.0) -> None:
        """See `tickwheel.client.Consumer.close`."""
        self._closed = True
        async with self._ready:
            self._ready.notify_all()
        await asyncio.gather(*(stream.close(timeout_s) for stream in self._streams or ()))
        for reader in self._readers:
            reader.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
        if self._receipts is not None:
            self._receipts.close()

    async def _open(self) -> None:
        self._streams = []
        self._added((await self._client.shards()).count)
        self._readers.append(asyncio.create_task(self._watch()))

    def _added(self, count: int) -> int:
        """A stream and its reader for each shard up to ``count`` beyond those known, each
        with its part of the prefetch among ``count``; how many were added."""
        known = self._streams or []
        prefetch = shard_prefetch(self._prefetch, count)
        added = [AsyncShardStream(self._client, self._subscribe, prefetch, shard)
                 for shard in range(len(known), count)]
        self._streams = known + added
        self._readers += [asyncio.create_task(self._read(stream)) for stream in added]
        return len(added)

    async def _watch(self) -> None:
        """Read the map every `MAP_CHECK_S`; open a stream to each shard added."""
        while not self._closed:
            await asyncio.sleep(MAP_CHECK_S)
            try:
                count = (await self._client.refresh_shards()).count
            except TickwheelClientError as error:
                log.debug("event=consumer_map_unread code=%s", error.code.name)
                continue
            if not self._closed and self._added(count):
                log.info("event=consumer_shards_added shards=%d", count)

    def _waiting(self, streams: list[AsyncShardStream] | None) -> AsyncShardStream | None:
        """See `tickwheel.client.Consumer._waiting`."""
        stream, self._turn, self._held_s = next_in_turn(streams or [], self._turn,
                                                        self._ready.notify_all)
        return stream

    async def _read(self, stream: AsyncShardStream) -> None:
        """A shard's reader: receive a batch once the last one was taken, until closed."""
        try:
            while True:
                async with self._ready:
                    await self._ready.wait_for(lambda: not stream.waiting or self._closed)
                    if self._closed:
                        return
                await stream.receive()
                async with self._ready:
                    self._ready.notify_all()
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # the iterator raises it
            async with self._ready:
                self._failure = error
                self._ready.notify_all()


class AsyncShardStream:
    """The messages of one topic from one shard; reconnects like
    `tickwheel.client.consumers.ShardStream`."""

    def __init__(self, client: AsyncStreamClient, subscribe: pb.ReceiveRequest, prefetch: int,
                 shard: int = 0) -> None:
        self._client = client
        self._shard = shard
        self._subscribe = with_credits(subscribe, prefetch)
        self._arrivals = Arrivals(self._send)
        self._credits = Credits(prefetch)
        self._pending: list[Queued | None] = []
        self._wakeup = asyncio.Event()
        self._flush = asyncio.Event()
        """Something queued goes at once (`urgent`), and takes the acks waiting with it."""
        self._call: _Stream | None = None
        self._writer: asyncio.Task[None] | None = None
        self._closed = False

    def take(self) -> Received | None:
        """The next message received that may be taken now, if one waits (None if not), and
        its credit."""
        if self._call is not None and self._call.done() and len(self._arrivals):
            self._arrivals.drop(self._address)  # a finished stream's: see Arrivals.drop
            self._drop_stream()
        message = self._arrivals.take()
        if message is None:
            return None
        if credits := self._credits.handed_out():
            self._queue(("credit", credits))
        return message

    def release(self) -> float | None:
        """`tickwheel.client._core.Arrivals.release`."""
        return self._arrivals.release()

    @property
    def waiting(self) -> bool:
        """Whether received messages wait to be taken now (`Arrivals.waiting`)."""
        return self._arrivals.waiting

    async def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued (acks), end the stream, and wait up to ``timeout_s`` for the
        node to close it; messages still on their way are redelivered to other consumers."""
        self._closed = True
        call = self._call
        if call is not None:
            self._queue(None)
            try:
                await asyncio.wait_for(call.wait_for_connection(), timeout_s)
                await asyncio.wait_for(call.code(), timeout_s)
            except (TimeoutError, grpc.RpcError):
                pass
        self._drop_stream()

    def _send(self, kind: Literal["ack", "nack"], receipt: str) -> None:
        self._queue((kind, receipt))

    def _queue(self, item: Queued | None) -> None:
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

    async def receive(self) -> None:
        """Wait for the next batch, (re)connecting as needed."""
        async for attempt in AsyncRetrying(retry=retry_if_exception_type(Reconnect),
                                           wait=CONSUMER_WAIT, reraise=True):
            with attempt:
                if self._closed:
                    return
                call = self._call
                if call is None:
                    if self._client._shards.routers[self._shard].leader is None:
                        await self._client._learn_leader(self._shard)
                    call = self._connect()
                await self._read_one(call)

    def _connect(self) -> _Stream:
        self._address = self._client._shards.routers[self._shard].choose()
        self._call = call = self._client._stub(self._address).Receive(
            metadata=self._client._metadata)
        self._pending.clear()
        self._credits.reset()
        self._arrivals.broke()
        self._writer = asyncio.create_task(self._write(call))
        return call

    async def _write(self, call: _Stream) -> None:
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
                for request in merged_requests(i for i in items if i is not None):
                    await call.write(request)
                if None in items:
                    await call.done_writing()
                    return
        except (grpc.RpcError, asyncio.InvalidStateError):
            return

    async def _read_one(self, call: _Stream) -> None:
        try:
            response = await call.read()
        except grpc.aio.AioRpcError as error:
            self._drop_stream()
            if self._closed:
                return
            if not retryable(error):
                raise translate(error) from None
            router = self._client._shards.routers[self._shard]
            metadata = error.trailing_metadata()
            router.observe(metadata)
            router.failed(self._address, metadata)
            log.info("event=consumer_reconnect target=%s code=%s", self._address,
                     error.code().name)
            raise Reconnect from error
        if not isinstance(response, pb.ReceiveResponse):  # grpc.aio.EOF: the node ended it
            self._drop_stream()
            raise Reconnect
        self._arrivals.add(response)
