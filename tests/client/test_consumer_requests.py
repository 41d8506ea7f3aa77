"""What a consumer sends back on its stream: credits in batches, acks waiting for company. A
request per delivery batch (a credit each time the buffer ran dry, an ack each 2 ms) made the
consumer and the leader spend more on gRPC than on the messages."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tickwheel.client import consumers
from tickwheel.client._core import ACK_LINGER_S, Credits, subscribe_request
from tickwheel.client.aio_consumers import AsyncShardStream
from tickwheel.client.consumers import Consumer, Outbox, ShardStream
from tickwheel.v1 import tickwheel_pb2 as pb

SUBSCRIBE = subscribe_request("orders", 64, 0, "c1")


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
    consumer._buffer.extend(["m1", "m2", "m3"])  # type: ignore[list-item]
    assert [consumer.take() for _ in range(3)] == ["m1", "m2", "m3"]
    assert consumer._requests._items == []  # 3 of a batch of 8: nothing owed yet
    consumer._buffer.extend(["m4", "m5", "m6", "m7", "m8"])  # type: ignore[list-item]
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
        consumer._buffer.extend(["m1", "m2", "m3"])  # type: ignore[list-item]
        for _ in range(3):
            consumer.take()
        assert consumer._pending == []
        consumer._send("ack", "r1")
        assert consumer._wakeup.is_set() and not consumer._flush.is_set()
        consumer._buffer.extend(["m4", "m5", "m6", "m7", "m8"])  # type: ignore[list-item]
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
    stream._buffer.extend([f"m{k}" for k in range(8)])  # type: ignore[misc]
    consumer._streams = [stream]
    wakes = []
    notify_all = threading.Condition.notify_all

    def counted(condition: threading.Condition) -> None:
        if condition is consumer._ready:  # not the other threads' of this worker
            wakes.append(stream.waiting)
        notify_all(condition)
    monkeypatch.setattr(threading.Condition, "notify_all", counted)
    assert [next(consumer) for _ in range(8)] == [f"m{k}" for k in range(8)]
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
