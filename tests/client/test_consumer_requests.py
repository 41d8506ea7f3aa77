"""What a consumer sends back on its stream: credits in batches, acks waiting for company. A
request per delivery batch (a credit each time the buffer ran dry, an ack each 2 ms) made the
consumer and the leader spend more on gRPC than on the messages."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest

from tickwheel.client import consumers
from tickwheel.client._core import ACK_LINGER_S, Arrivals, Credits, Received, subscribe_request
from tickwheel.client.aio_consumers import AsyncConsumer, AsyncShardStream
from tickwheel.client.consumers import Consumer, Outbox, ShardStream
from tickwheel.v1 import tickwheel_pb2 as pb

SUBSCRIBE = subscribe_request("orders", 64, 0, "c1")


def batch(*ids: str, hold_ms: int = 0) -> pb.ReceiveResponse:
    """A response a node sends: messages of these ids, each held ``hold_ms``."""
    return pb.ReceiveResponse(messages=[pb.Delivered(id=id_, topic="orders", receipt=f"r-{id_}",
                                                     hold_ms=hold_ms) for id_ in ids])


def ids(messages: list[Received | None]) -> list[str | None]:
    return [None if m is None else m.id for m in messages]


def test_credits_go_back_a_batch_at_a_time_and_the_node_keeps_most_of_the_prefetch() -> None:
    credits = Credits(prefetch=2_000)
    sent = [credits.handed_out() for _ in range(1_000)]
    assert [n for n in sent if n] == [250] * 4  # prefetch // 8
    held = 0
    for n in sent:  # what the node holds never falls below prefetch - batch + 1
        held = held + 1 - n
        assert 2_000 - held >= 2_000 - 250 + 1
    assert Credits(prefetch=1).handed_out() == 1  # a prefetch of one credits every message


def test_a_consumer_that_empties_its_buffer_does_not_send_a_credit_for_each_batch() -> None:
    consumer = ShardStream(None, SUBSCRIBE, 64)  # type: ignore[arg-type]
    consumer._arrivals.add(batch("m1", "m2", "m3"))
    assert ids([consumer.take() for _ in range(3)]) == ["m1", "m2", "m3"]
    assert consumer._requests._items == []  # 3 of a batch of 8: nothing owed yet
    consumer._arrivals.add(batch("m4", "m5", "m6", "m7", "m8"))
    [consumer.take() for _ in range(5)]
    assert consumer._requests.take(0) == [("credit", 8)]


def test_acks_and_a_due_credit_leave_in_one_flush_and_the_end_sends_what_waits() -> None:
    consumer = ShardStream(None, SUBSCRIBE, 64)  # type: ignore[arg-type]
    requests = Outbox()
    for item in [("ack", "r1"), ("ack", "r2"), ("credit", 8), ("ack", "r3"), None]:
        requests.put(item)  # type: ignore[arg-type]
    sent = list(consumer._outgoing(requests))
    assert sent[0].WhichOneof("kind") == "subscribe"
    assert [(r.WhichOneof("kind"), list(r.ack.receipts) or r.credit.credits)
            for r in sent[1:]] == [("ack", ["r1", "r2", "r3"]), ("credit", 8)]


def test_acks_within_a_linger_wake_the_sending_thread_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer acks every message it takes; the thread that sends them is woken for the
    first ack of a linger window, not for each (a wake-up is a hand-over of the GIL and two
    system calls: at 500 messages a second, 500 of them)."""
    monkeypatch.setattr(consumers, "ACK_LINGER_S", 1.0)  # every ack below within one window
    consumer = ShardStream(None, SUBSCRIBE, 64)  # type: ignore[arg-type]
    requests = consumer._requests
    outgoing = consumer._outgoing(requests)
    next(outgoing)  # the subscription
    sent: list[pb.ReceiveRequest] = []
    sender = threading.Thread(target=lambda: sent.append(next(outgoing)))
    sender.start()
    wakes = []
    notify = threading.Condition.notify

    def counted(condition: threading.Condition, n: int = 1) -> None:
        if condition is requests._changed:  # not the other threads' of this worker
            wakes.append(n)
        notify(condition, n)
    monkeypatch.setattr(threading.Condition, "notify", counted)
    for k in range(100):
        consumer._send("ack", f"r{k}")
    sender.join(5)
    assert list(sent[0].ack.receipts) == [f"r{k}" for k in range(100)]
    assert len(wakes) == 1


def test_the_async_consumer_credits_in_batches_and_lets_acks_wait() -> None:
    async def run() -> None:
        consumer = AsyncShardStream(None, SUBSCRIBE, 64)  # type: ignore[arg-type]
        consumer._arrivals.add(batch("m1", "m2", "m3"))
        for _ in range(3):
            consumer.take()
        assert consumer._pending == []
        consumer._send("ack", "r1")
        assert consumer._wakeup.is_set() and not consumer._flush.is_set()
        consumer._arrivals.add(batch("m4", "m5", "m6", "m7", "m8"))
        for _ in range(5):
            consumer.take()
        assert consumer._pending == [("ack", "r1"), ("credit", 8)]
        assert consumer._flush.is_set()

    asyncio.run(run())
    assert ACK_LINGER_S <= 0.05  # acks wait briefly: a lease lasts seconds


def test_taking_a_batch_wakes_its_reader_once_it_is_emptied(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The iterating thread wakes the shard's reader when it took the last message of a
    batch (the reader then reads the next), not for each message it takes."""
    consumer = Consumer(None, SUBSCRIBE, 64)  # type: ignore[arg-type]
    stream = ShardStream(None, SUBSCRIBE, 64)  # type: ignore[arg-type]
    stream._arrivals.add(batch(*(f"m{k}" for k in range(8))))
    consumer._streams = [stream]
    wakes = []
    notify_all = threading.Condition.notify_all

    def counted(condition: threading.Condition) -> None:
        if condition is consumer._ready:  # not the other threads' of this worker
            wakes.append(stream.waiting)
        notify_all(condition)
    monkeypatch.setattr(threading.Condition, "notify_all", counted)
    assert ids([next(consumer) for _ in range(8)]) == [f"m{k}" for k in range(8)]
    assert wakes == [False]


def test_a_read_on_an_open_stream_sets_up_no_retrying(monkeypatch: pytest.MonkeyPatch) -> None:
    """tenacity's retry loop is set up for a reconnection only: a batch read on an open
    stream costs none of it."""
    made = []
    retrying = consumers.Retrying

    def counted(*args: object, **kwargs: object) -> object:
        made.append(kwargs)
        return retrying(*args, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setattr(consumers, "Retrying", counted)
    stream = ShardStream(None, SUBSCRIBE, 64)  # type: ignore[arg-type]
    stream._stream = iter([pb.ReceiveResponse()] * 3)  # type: ignore[assignment]
    for _ in range(3):
        stream.receive()
    assert made == []


def test_a_held_message_is_taken_once_its_hold_ends_and_the_others_at_once() -> None:
    """Held messages wait their ``hold_ms`` from their arrival, on the consumer's clock, and
    come out in the order their holds end (arrival order among equals); a message without a
    hold is taken at once, even behind held ones."""
    now_s = [100.0]
    arrivals = Arrivals(lambda kind, receipt: None, lambda: now_s[0])
    arrivals.add(batch("late", hold_ms=30))
    arrivals.add(batch("soon-1", "soon-2", hold_ms=10))
    now_s[0] += 0.005
    arrivals.add(batch("due"))
    assert ids([arrivals.take(), arrivals.take()]) == ["due", None]
    assert len(arrivals) == 3 and not arrivals.waiting  # the held ones do not stop the reader
    assert arrivals.release() == pytest.approx(0.005)
    now_s[0] += 0.0051
    assert ids([arrivals.take(), arrivals.take(), arrivals.take()]) == ["soon-1", "soon-2", None]
    assert arrivals.release() == pytest.approx(0.0199)
    now_s[0] += 0.0198
    assert arrivals.take() is None
    now_s[0] += 0.0002
    assert ids([arrivals.take()]) == ["late"]
    assert arrivals.release() is None and len(arrivals) == 0


def test_a_reader_whose_response_was_all_held_is_woken_to_read_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The iterating thread sorts a response that is all held as soon as it looks, and
    wakes the shard's reader then: a message due now in the next response must not wait
    behind the hold. It takes the held message once its hold ends."""
    consumer = Consumer(None, SUBSCRIBE, 64)  # type: ignore[arg-type]
    stream = ShardStream(None, SUBSCRIBE, 64)  # type: ignore[arg-type]
    stream._arrivals.add(batch("held", hold_ms=50))
    consumer._streams = [stream]
    wakes = []
    notify_all = threading.Condition.notify_all

    def counted(condition: threading.Condition) -> None:
        if condition is consumer._ready:  # not the other threads' of this worker
            wakes.append(len(stream._arrivals))
        notify_all(condition)
    monkeypatch.setattr(threading.Condition, "notify_all", counted)
    started_s = time.monotonic()
    assert next(consumer).id == "held"
    assert time.monotonic() - started_s >= 0.05
    assert wakes == [1, 0]  # the reader woken while the message was held, and once it left


def test_the_async_consumer_waits_out_a_hold() -> None:
    async def run() -> float:
        consumer = AsyncConsumer(None, SUBSCRIBE, 64)  # type: ignore[arg-type]
        stream = AsyncShardStream(None, SUBSCRIBE, 64)  # type: ignore[arg-type]
        consumer._streams = [stream]
        stream._arrivals.add(batch("held", hold_ms=50))
        started_s = time.monotonic()
        assert (await anext(consumer)).id == "held"
        return time.monotonic() - started_s

    assert asyncio.run(run()) >= 0.05


class Unavailable(grpc.RpcError):
    """What a stream raises when its leader goes away."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "the leader went away"


class Call:
    """A consumer stream as grpc hands it out: its responses, then an error or a wait."""

    def __init__(self, responses: list[pb.ReceiveResponse], error: bool) -> None:
        self._responses = responses
        self._error = error
        self._ended = threading.Event()

    def __iter__(self) -> Call:
        return self

    def __next__(self) -> pb.ReceiveResponse:
        if self._responses:
            return self._responses.pop(0)
        if self._error:
            raise Unavailable
        self._ended.wait(30)
        raise StopIteration

    def is_active(self) -> bool:
        return not self._ended.is_set()

    def cancel(self) -> None:
        self._ended.set()


class Leaders:
    """A client whose first stream brings a held message and breaks, and whose next one
    (the new leader) brings another."""

    def __init__(self) -> None:
        self.calls = [Call([batch("old", hold_ms=50)], error=True), Call([batch("new")], False)]

    def _open_stream(self, requests: object, shard: int) -> tuple[str, Call]:
        return f"leader-{len(self.calls)}", self.calls.pop(0)

    def _route_failed(self, address: str, error: object, shard: int) -> None:
        pass


def test_a_held_message_of_a_stream_that_broke_is_never_handed_out() -> None:
    """Held messages do not keep a stream's reader from reading, so it can meet the stream's
    end and reconnect while they are held. They came under leases that ended with that
    stream (the next leader sends them again, flagged): handed out once their hold ended,
    each would be an unflagged duplicate."""
    now_s = [100.0]
    client = Leaders()
    consumer = Consumer(client, SUBSCRIBE, 64)  # type: ignore[arg-type]
    stream = ShardStream(client, SUBSCRIBE, 64)  # type: ignore[arg-type]
    stream._arrivals = Arrivals(stream._send, lambda: now_s[0])
    consumer._streams = [stream]
    reader = threading.Thread(target=consumer._read, args=(stream,), daemon=True)
    reader.start()
    try:
        assert next(consumer).id == "new"
        now_s[0] += 1  # the old message's hold is long over
        assert stream.take() is None and len(stream._arrivals) == 0
    finally:
        consumer.close(0)  # cancels the open stream
        reader.join(5)


def test_what_came_before_a_break_is_dropped_and_what_came_after_is_kept() -> None:
    """`Arrivals.broke` marks where one stream ended and the next began (both consumers,
    sync and asyncio, mark it when they reconnect)."""
    now_s = [100.0]
    arrivals = Arrivals(lambda kind, receipt: None, lambda: now_s[0])
    arrivals.add(batch("ready-old"))
    arrivals.add(batch("held-old", hold_ms=10))
    arrivals.broke()
    arrivals.add(batch("held-new", hold_ms=10))
    now_s[0] += 1
    assert ids([arrivals.take(), arrivals.take()]) == ["held-new", None]
