"""Concurrent `schedule` calls share requests, and each still gets its own message's answer.

The node here is a fake ``schedule_many`` that holds each request until the test lets it go, so
that which calls wait, and what the next request carries, is decided by the test, not by
timing."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import grpc
import pytest

from tickwheel.client.coalescing import AsyncCoalescer, Coalescer
from tickwheel.client.errors import InvalidArgument, Unavailable
from tickwheel.client.messages import Message, Scheduled

WAIT_S = 10.0


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)


def message(id_: str, topic: str = "orders", body: bytes = b"x") -> Message:
    return Message(topic, body, delay_ms=1_000, id=id_)


class Node:
    """A fake ``schedule_many``: records each request's ids and holds it until `release`;
    refuses a request with a message of topic ``bad`` as INVALID_ARGUMENT (the whole request,
    as the node does), and every request while ``down``."""

    def __init__(self) -> None:
        self.requests: list[list[str]] = []
        self.open = threading.Event()
        self.down = False
        self.interrupt_at: int | None = None

    def release(self) -> None:
        self.open.set()

    def __call__(self, messages: list[Message]) -> list[Scheduled]:
        self.requests.append([m.id for m in messages])
        if len(self.requests) == self.interrupt_at:
            raise KeyboardInterrupt
        assert self.open.wait(WAIT_S)
        return answers(messages, self.down)


def answers(messages: list[Message], down: bool) -> list[Scheduled]:
    if down:
        raise Unavailable(grpc.StatusCode.UNAVAILABLE, "no leader")
    for i, m in enumerate(messages):
        if m.topic == "bad":
            raise InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"messages[{i}].topic: no such topic")
    return [Scheduled(m.id, int(m.id.strip("abcdefghijklmnopqrstuvwxyz-") or 0), 0, False, 0)
            for m in messages]


class Callers:
    """Threads that each schedule one message through ``coalescer``, and what each got."""

    def __init__(self, coalescer: Coalescer) -> None:
        self.coalescer = coalescer
        self.got: dict[str, Scheduled | BaseException] = {}
        self.threads: list[threading.Thread] = []

    def call(self, m: Message) -> None:
        def run() -> None:
            try:
                self.got[m.id] = self.coalescer.schedule(m)
            except BaseException as error:  # what the caller would see
                self.got[m.id] = error
        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)

    def call_waiting(self, m: Message) -> None:
        """``call``, then wait until it waits for a request: calls queue in this order."""
        waiting = queued(self.coalescer)
        self.call(m)
        wait_until(lambda: queued(self.coalescer) == waiting + 1, f"{m.id} to wait")

    def join(self) -> None:
        for thread in self.threads:
            thread.join(WAIT_S)
            assert not thread.is_alive()


def queued(coalescer: Coalescer | AsyncCoalescer) -> int:
    return len(coalescer._waiting)


def test_a_lone_call_is_sent_at_once_in_a_request_of_its_own() -> None:
    node = Node()
    node.release()
    coalescer = Coalescer(node)
    assert coalescer.schedule(message("m1")).id == "m1"
    assert coalescer.schedule(message("m2")).id == "m2"
    assert node.requests == [["m1"], ["m2"]]


def test_calls_made_while_the_requests_are_out_go_together_in_the_next() -> None:
    node = Node()
    coalescer = Coalescer(node, max_requests=2)
    callers = Callers(coalescer)
    callers.call(message("m1"))
    callers.call(message("m2"))
    wait_until(lambda: len(node.requests) == 2, "two requests out")
    for i in range(3, 9):
        callers.call(message(f"m{i}"))
    wait_until(lambda: queued(coalescer) == 6, "six calls waiting")
    node.release()
    callers.join()
    assert sorted(node.requests[:2]) == [["m1"], ["m2"]]
    assert node.requests[2:] == [[f"m{i}" for i in range(3, 9)]]
    assert {id_: got.id for id_, got in callers.got.items()  # type: ignore[union-attr]
            } == {f"m{i}": f"m{i}" for i in range(1, 9)}


def test_a_shared_request_keeps_to_its_size_limits() -> None:
    node = Node()
    coalescer = Coalescer(node, max_requests=1, max_msgs=3, max_bytes=1_000)
    callers = Callers(coalescer)
    callers.call(message("m0"))
    wait_until(lambda: len(node.requests) == 1, "the first request out")
    for m in [*(message(f"m{i}") for i in range(1, 6)), message("big", body=b"x" * 2_000),
              message("m6")]:
        callers.call_waiting(m)
    node.release()
    callers.join()
    assert node.requests == [["m0"], ["m1", "m2", "m3"], ["m4", "m5"], ["big"], ["m6"]]


def test_a_bad_message_fails_its_own_call_and_the_others_are_scheduled() -> None:
    node = Node()
    coalescer = Coalescer(node, max_requests=1)
    callers = Callers(coalescer)
    callers.call(message("m1"))
    wait_until(lambda: len(node.requests) == 1, "the first request out")
    for m in [message("m2"), message("m3", topic="bad"), message("m4")]:
        callers.call_waiting(m)
    node.release()
    callers.join()
    assert node.requests == [["m1"], ["m2", "m3", "m4"], ["m2"], ["m3"], ["m4"]]
    refused = callers.got["m3"]
    assert isinstance(refused, InvalidArgument)
    assert refused.field == "messages[0].topic"  # as if it had been sent alone
    assert [callers.got[i].id for i in ("m1", "m2", "m4")] == ["m1", "m2", "m4"]  # type: ignore[union-attr]


def test_a_cluster_error_fails_every_call_of_the_request_without_sending_each_again() -> None:
    node = Node()
    node.down = True
    coalescer = Coalescer(node, max_requests=1)
    callers = Callers(coalescer)
    callers.call(message("m1"))
    wait_until(lambda: len(node.requests) == 1, "the first request out")
    for i in (2, 3):
        callers.call(message(f"m{i}"))
    wait_until(lambda: queued(coalescer) == 2, "two calls waiting")
    node.release()
    callers.join()
    assert node.requests == [["m1"], ["m2", "m3"]]
    assert all(isinstance(got, Unavailable) for got in callers.got.values())
    # each caller raises an exception of its own: one raised in two threads at once would
    # carry both their tracebacks
    assert len({id(got) for got in callers.got.values()}) == 3


def test_a_thread_interrupted_while_sending_for_others_hands_their_calls_on() -> None:
    """The thread that sends a shared request is one of the callers. Interrupted there
    (KeyboardInterrupt), it raises, and the other calls of its request are sent by another
    waiting thread: none is left waiting, none gets the interrupt."""
    node = Node()
    node.interrupt_at = 2
    coalescer = Coalescer(node, max_requests=1)
    callers = Callers(coalescer)
    callers.call(message("m1"))
    wait_until(lambda: len(node.requests) == 1, "the first request out")
    for i in (2, 3, 4):
        callers.call(message(f"m{i}"))
    wait_until(lambda: queued(coalescer) == 3, "three calls waiting")
    node.release()
    callers.join()
    interrupted = [id_ for id_, got in callers.got.items() if isinstance(got, KeyboardInterrupt)]
    assert len(interrupted) == 1 and interrupted[0] in ("m2", "m3", "m4")
    others = sorted({"m2", "m3", "m4"} - set(interrupted))
    assert node.requests[1] == ["m2", "m3", "m4"]
    assert node.requests[2:] == [others]  # sent again without the interrupted caller's
    assert all(callers.got[i].id == i for i in others)  # type: ignore[union-attr]


class AsyncNode:
    def __init__(self) -> None:
        self.requests: list[list[str]] = []
        self.open = asyncio.Event()

    async def __call__(self, messages: list[Message]) -> list[Scheduled]:
        self.requests.append([m.id for m in messages])
        await self.open.wait()
        return answers(messages, False)


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0)


def test_asyncio_calls_share_requests_and_a_bad_message_fails_alone() -> None:
    async def main() -> None:
        node = AsyncNode()
        coalescer = AsyncCoalescer(node, max_requests=1)
        first = asyncio.create_task(coalescer.schedule(message("m1")))
        await until(lambda: len(node.requests) == 1, "the first request out")
        rest = [asyncio.create_task(coalescer.schedule(m))
                for m in (message("m2"), message("m3", topic="bad"), message("m4"))]
        await until(lambda: queued(coalescer) == 3, "three calls waiting")
        node.open.set()
        got = await asyncio.gather(first, *rest, return_exceptions=True)
        assert node.requests == [["m1"], ["m2", "m3", "m4"], ["m2"], ["m3"], ["m4"]]
        assert [getattr(g, "id", None) for g in got] == ["m1", "m2", None, "m4"]
        assert isinstance(got[2], InvalidArgument)
    asyncio.run(main())


def test_an_asyncio_call_cancelled_cancels_nothing_of_the_others() -> None:
    """Cancelled while it waits, a call's message is never sent; cancelled while its request
    is out, the request goes on and the other calls in it get their answers."""
    async def main() -> None:
        node = AsyncNode()
        coalescer = AsyncCoalescer(node, max_requests=1)
        first = asyncio.create_task(coalescer.schedule(message("m1")))
        await until(lambda: len(node.requests) == 1, "the first request out")
        second = asyncio.create_task(coalescer.schedule(message("m2")))
        third = asyncio.create_task(coalescer.schedule(message("m3")))
        await until(lambda: queued(coalescer) == 2, "two calls waiting")
        third.cancel()  # still waiting: never sent
        first.cancel()  # its request is out: it goes on
        with pytest.raises(asyncio.CancelledError):
            await first
        with pytest.raises(asyncio.CancelledError):
            await third
        node.open.set()
        assert (await second).id == "m2"
        await coalescer.wait_sent()
        assert node.requests == [["m1"], ["m2"]]
    asyncio.run(main())
