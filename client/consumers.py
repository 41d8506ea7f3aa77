"""The blocking client's consumer: a stream per shard, merged.

A thread per shard reads its shard's stream (one response at a time, and only once what the
last one brought has been taken, held messages aside), and the iterator takes from the shards
in turn, so that every shard's messages flow and none waits behind another's. The streams
subscribe with ``hold``: the leader sends a dispatch step's messages at once, and the iterator
hands each out when its hold ends (`tickwheel.client._core.Arrivals`). Another thread reads
the shard map every `MAP_CHECK_S` and opens a stream to each shard a growth adds (a cluster of
one shard grows too).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal, Protocol

import grpc
from tenacity import Retrying, retry_if_exception_type

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

if TYPE_CHECKING:
    # What a stream-stream call returns, as grpc's type stubs name it (no class at run time).
    from grpc import _CallIterator

log = logging.getLogger("tickwheel.client")


class StreamClient(Protocol):
    """What a consumer asks of `tickwheel.client.Client`."""

    def shards(self) -> ShardRouters: ...

    def refresh_shards(self) -> ShardRouters: ...

    def _open_stream(self, requests: Iterator[pb.ReceiveRequest], shard: int
                     ) -> tuple[str, _CallIterator[pb.ReceiveResponse]]: ...

    def _route_failed(self, address: str, error: grpc.RpcError, shard: int) -> None: ...


class Consumer:
    """An iterator of `Received` messages of one topic, from every shard of the cluster.
    Reconnects to each shard's leader whenever its stream breaks, for as long as it is
    iterated; messages in flight on a broken stream come back from the new leader, flagged
    ``possible_duplicate``. ``close`` it (or use it as a context manager) when done."""

    def __init__(self, client: StreamClient, subscribe: pb.ReceiveRequest,
                 prefetch: int, receipts: ReceiptLog | None = None) -> None:
        self._client = client
        self._receipts = receipts
        self._subscribe = subscribe
        self._prefetch = prefetch
        self._streams: list[ShardStream] | None = None
        self._ready = threading.Condition()
        self._readers: list[threading.Thread] = []
        self._turn = 0
        self._held_s: float | None = None
        self._failure: BaseException | None = None
        self._closed = False

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Consumer:
        return self

    def __next__(self) -> Received:
        if self._streams is None:
            self._open()
        while True:
            with self._ready:
                stream = self._waiting(self._streams)
                while stream is None:
                    if self._failure is not None:
                        raise self._failure
                    if self._closed:
                        raise StopIteration
                    self._ready.wait(self._held_s)
                    stream = self._waiting(self._streams)
            message = stream.take()
            if not stream.waiting:  # its reader may read on: wake it once, not per message
                with self._ready:
                    self._ready.notify_all()
            if message is not None:
                if self._receipts is not None:
                    self._receipts.record(message)
                return message

    def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued (acks), end the streams, and wait up to ``timeout_s`` for the
        nodes to close them; messages still on their way are redelivered to other consumers.
        Safe to call from another thread while one iterates."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()
        for stream in self._streams or ():
            stream.close(timeout_s)
        for reader in self._readers:
            reader.join(timeout_s)
        if self._receipts is not None:
            self._receipts.close()

    def _open(self) -> None:
        self._streams = []
        readers = self._added(self._client.shards().count)
        watcher = threading.Thread(target=self._watch, daemon=True,
                                   name="tickwheel-consumer-map")
        self._readers.append(watcher)
        if self._closed:  # closed from another thread meanwhile
            for stream in self._streams:
                stream.close(0)
        for reader in [*readers, watcher]:
            reader.start()

    def _added(self, count: int) -> list[threading.Thread]:
        """A stream for each shard up to ``count`` beyond those known, each with its part of
        the prefetch among ``count``; their readers, to start."""
        known = self._streams or []
        prefetch = shard_prefetch(self._prefetch, count)
        added = [ShardStream(self._client, self._subscribe, prefetch, shard)
                 for shard in range(len(known), count)]
        readers = [threading.Thread(target=self._read, args=(stream,), daemon=True,
                                    name=f"tickwheel-consumer-shard-{len(known) + index}")
                   for index, stream in enumerate(added)]
        self._streams = known + added
        self._readers += readers
        return readers

    def _watch(self) -> None:
        """Read the map every `MAP_CHECK_S`; open a stream to each shard added."""
        while True:
            with self._ready:
                if self._ready.wait_for(lambda: self._closed, MAP_CHECK_S):
                    return
            try:
                count = self._client.refresh_shards().count
            except TickwheelClientError as error:
                log.debug("event=consumer_map_unread code=%s", error.code.name)
                continue
            with self._ready:
                readers = [] if self._closed else self._added(count)
            if readers:
                log.info("event=consumer_shards_added shards=%d", count)
            for reader in readers:
                reader.start()

    def _waiting(self, streams: list[ShardStream] | None) -> ShardStream | None:
        """The next shard in turn with a message to take now (`next_in_turn`); `_held_s` is
        set to how long until the first held message may be taken. Called with ``_ready``
        held."""
        stream, self._turn, self._held_s = next_in_turn(streams or [], self._turn,
                                                        self._ready.notify_all)
        return stream

    def _read(self, stream: ShardStream) -> None:
        """A shard's reader: receive a batch once the last one was taken, until closed."""
        try:
            while True:
                with self._ready:
                    while stream.waiting and not self._closed:
                        self._ready.wait()
                    if self._closed:
                        return
                stream.receive()
                with self._ready:
                    self._ready.notify_all()
        except BaseException as error:  # the iterator raises it
            with self._ready:
                self._failure = error
                self._ready.notify_all()


class Outbox:
    """A consumer stream's requests waiting to be sent, and the wake-ups of the thread that
    sends them (gRPC's, iterating `ShardStream._outgoing`): an ack wakes it only when nothing
    waits, then it lingers `ACK_LINGER_S` and the acks that come meanwhile join without a
    wake-up each (a `queue.Queue` woke it for every one: a consumer's thread hand-over per
    message); a credit batch or the end wakes it at once."""

    def __init__(self) -> None:
        self._items: list[Queued | None] = []
        self._changed = threading.Condition(threading.Lock())
        self._urgent = False

    def put(self, item: Queued | None) -> None:
        with self._changed:
            self._items.append(item)
            if urgent(item):
                self._urgent = True
                self._changed.notify()
            elif len(self._items) == 1:
                self._changed.notify()

    def take(self, linger_s: float) -> list[Queued | None]:
        """What waits, once there is something and then ``linger_s`` has passed or something
        urgent came; up to and with the first end (None), if any."""
        with self._changed:
            self._changed.wait_for(lambda: self._items)
            if not self._urgent:
                self._changed.wait_for(lambda: self._urgent, linger_s)
            items, self._items, self._urgent = self._items, [], False
        if None in items:
            del items[items.index(None) + 1:]
        return items


class ShardStream:
    """The messages of one topic from one shard: a stream to its leader. Reconnects (to the
    leader, with back-off) whenever the stream breaks, for as long as it is iterated; messages
    in flight on a broken stream come back from the new leader, flagged
    ``possible_duplicate``."""

    def __init__(self, client: StreamClient, subscribe: pb.ReceiveRequest, prefetch: int,
                 shard: int = 0) -> None:
        self._client = client
        self._shard = shard
        self._subscribe = with_credits(subscribe, prefetch)
        self._credits = Credits(prefetch)
        self._arrivals = Arrivals(self._send)
        self._requests = Outbox()
        self._stream: _CallIterator[pb.ReceiveResponse] | None = None
        self._read_lock = threading.Lock()
        self._closed = False

    def take(self) -> Received | None:
        """The next message received that may be taken now, if one waits (None if not), and
        its credit. From the consumer's iterating thread only."""
        stream = self._stream
        if stream is not None and not stream.is_active() and len(self._arrivals):
            self._drop_buffered()
        message = self._arrivals.take()
        if message is None:
            return None
        if credits := self._credits.handed_out():
            self._requests.put(("credit", credits))
        return message

    def release(self) -> float | None:
        """`Arrivals.release`, from the consumer's iterating thread."""
        return self._arrivals.release()

    @property
    def waiting(self) -> bool:
        """Whether received messages wait to be taken now (`Arrivals.waiting`)."""
        return self._arrivals.waiting

    def _drop_buffered(self) -> None:
        """The stream ended while messages it sent wait here (`Arrivals.drop`)."""
        self._arrivals.drop(self._address)
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

    def _send(self, kind: Literal["ack", "nack"], receipt: str) -> None:
        self._requests.put((kind, receipt))

    def receive(self) -> None:
        """Wait for the next batch, (re)connecting as needed: on an open stream, a read; once
        it breaks, reconnections with back-off (tenacity's, set up only then: a few tens of
        microseconds a batch otherwise)."""
        if self._read_open():
            return
        for attempt in Retrying(retry=retry_if_exception_type(Reconnect),
                                wait=CONSUMER_WAIT, reraise=True):
            with attempt, self._read_lock:
                if self._closed:
                    return
                self._read_one(self._stream or self._connect())

    def _read_open(self) -> bool:
        """Read a batch from the open stream: True once read (or the consumer is closed),
        False if there is no stream or it broke."""
        with self._read_lock:
            if self._closed:
                return True
            if self._stream is None:
                return False
            try:
                self._read_one(self._stream)
            except Reconnect:
                return False
            return True

    def _connect(self) -> _CallIterator[pb.ReceiveResponse]:
        self._requests.put(None)  # ends the request generator of the previous stream
        self._requests = Outbox()
        self._credits.reset()
        self._arrivals.broke()
        if self._closed:  # closed from another thread since the check: end the new stream too
            self._requests.put(None)
        self._address, self._stream = self._client._open_stream(self._outgoing(self._requests),
                                                                self._shard)
        return self._stream

    def _read_one(self, stream: _CallIterator[pb.ReceiveResponse]) -> None:
        try:
            response = next(stream)
        except StopIteration:
            self._stream = None
            raise Reconnect from None
        except grpc.RpcError as error:
            self._stream = None
            if self._closed:
                return
            if not retryable(error):
                raise translate(error) from None
            self._client._route_failed(self._address, error, self._shard)
            log.info("event=consumer_reconnect target=%s code=%s", self._address,
                     error.code().name)
            raise Reconnect from error
        self._arrivals.add(response)

    def _outgoing(self, requests: Outbox) -> Iterator[pb.ReceiveRequest]:
        yield self._subscribe
        while True:
            # Acks wait up to ACK_LINGER_S for company; a credit batch or the end takes them.
            items = requests.take(ACK_LINGER_S)
            yield from merged_requests(i for i in items if i is not None)
            if items[-1] is None:
                return
