"""Concurrent `schedule` calls of one client share requests.

An order service that schedules a time-out per order calls ``client.schedule`` from each of
its request threads (or tasks). Sent one request a call, every message costs a gRPC call on
both ends and a place in the leader's Raft round of its own; the node's CPU then goes to
calls, not to messages, and the callers wait in its queue.

A call sends its message at once while fewer than ``max_requests`` requests of the client are
on their way; otherwise it waits, and the next request to go takes every message waiting then
(up to ``max_msgs`` and about ``max_bytes``). A lone caller waits for nothing; many callers
share a request for each round trip, so batches grow with the load and no timer is involved.
The thread (or task) of a waiting call sends that next request itself: no thread of the
library's own.

Each call gets the answer its own message would have had alone. A shared request that fails
with an error of the cluster (`Unavailable` after the retries, `Unauthenticated`) fails every
call in it; one that fails otherwise (`InvalidArgument`, `PermissionDenied`, `RequestTooLarge`:
what one message may be) is sent again a message a request. Message ids make that second
sending idempotent, as they make the library's retries.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tickwheel.client.errors import Unauthenticated, Unavailable
from tickwheel.client.messages import Message, Scheduled

MAX_REQUESTS = 2
"""Shared requests on their way at once, per client: a second goes while the first waits for
its commit, so that a call made just after a request left need not wait out its round trip
(with one, the cluster spent a sixth less a message; with four, a quarter more)."""
MAX_MSGS = 1_000
"""Messages in one shared request."""
MAX_BYTES = 1 << 20
"""About the bytes of one shared request (bodies, ids, topics, properties): far below the
node's ``max_request_bytes``; a larger message goes alone."""
MESSAGE_OVERHEAD_BYTES = 32
"""What a message adds to a request beyond its fields' bytes, as counted against
``MAX_BYTES``."""
_CLUSTER_ERRORS = (Unavailable, Unauthenticated)
"""Errors of the cluster, not of a message: a shared request's is every call's. Another error
of a shared request sends its messages again one a request."""


def size_bytes(message: Message) -> int:
    body = message.body
    size = len(body.encode() if isinstance(body, str) else body)
    size += len(message.id) + len(message.topic) + len(message.routing_key)
    return size + sum(len(k) + len(v) for k, v in message.properties.items()) + (
        MESSAGE_OVERHEAD_BYTES)


@dataclass(slots=True)
class _Call:
    """One `schedule` call: its message, then its answer or error."""

    message: Message
    size_bytes: int
    answer: Scheduled | None = None
    error: BaseException | None = None
    answered: asyncio.Future[None] | None = None
    """Set once it is answered (`AsyncCoalescer`'s calls)."""

    @property
    def done(self) -> bool:
        return self.answer is not None or self.error is not None

    def result(self) -> Scheduled:
        if self.error is not None:
            raise self.error
        assert self.answer is not None
        return self.answer


def take(waiting: deque[_Call], max_msgs: int, max_bytes: int) -> list[_Call]:
    """The calls the next request carries, first come first: at least one, at most
    ``max_msgs``, and no more than ``max_bytes`` but for a first one larger alone."""
    batch = [waiting.popleft()]
    total = batch[0].size_bytes
    while waiting and len(batch) < max_msgs and total + waiting[0].size_bytes <= max_bytes:
        call = waiting.popleft()
        total += call.size_bytes
        batch.append(call)
    return batch


def settle(batch: list[_Call], answers: list[Scheduled] | Exception) -> bool:
    """Give each call of ``batch`` its answer, or the request's error; False (nothing given)
    when the error may be one message's and the calls must be sent again one by one."""
    if isinstance(answers, Exception):
        if len(batch) == 1:
            batch[0].error = answers
            return True
        if not isinstance(answers, _CLUSTER_ERRORS):
            return False
        for call in batch:  # an exception each: each caller's raise sets its own traceback
            call.error = type(answers)(answers.code, answers.details)
        return True
    for call, answer in zip(batch, answers, strict=True):
        call.answer = answer
    return True


class Coalescer:
    """`schedule` calls from several threads in shared requests, each sent by ``send``
    (the client's ``schedule_many``) on the thread of one of the waiting calls."""

    def __init__(self, send: Callable[[list[Message]], list[Scheduled]], *,
                 max_requests: int = MAX_REQUESTS, max_msgs: int = MAX_MSGS,
                 max_bytes: int = MAX_BYTES) -> None:
        self._send = send
        self._max_requests, self._max_msgs, self._max_bytes = max_requests, max_msgs, max_bytes
        self._changed = threading.Condition()
        self._waiting: deque[_Call] = deque()
        self._sending = 0

    def schedule(self, message: Message) -> Scheduled:
        call = _Call(message, size_bytes(message))
        changed = self._changed
        with changed:
            self._waiting.append(call)
        try:
            while True:
                with changed:
                    while not call.done and (self._sending >= self._max_requests
                                             or not self._waiting):
                        changed.wait()
                    if call.done:
                        return call.result()
                    batch = take(self._waiting, self._max_msgs, self._max_bytes)
                    self._sending += 1
                self._send_batch(batch)
        except BaseException:  # KeyboardInterrupt while waiting: its message is not sent
            with changed:
                if call in self._waiting:
                    self._waiting.remove(call)
            raise

    def _send_batch(self, batch: list[_Call]) -> None:
        try:
            if not settle(batch, self._sent([call.message for call in batch])):
                for call in batch:
                    settle([call], self._sent([call.message]))
        except BaseException:
            # this thread was interrupted (KeyboardInterrupt): the calls it was sending for
            # go back to the head of the line for another thread to send (ids make it safe)
            with self._changed:
                self._waiting.extendleft(reversed([c for c in batch if not c.done]))
            raise
        finally:
            with self._changed:
                self._sending -= 1
                self._changed.notify_all()

    def _sent(self, messages: list[Message]) -> list[Scheduled] | Exception:
        try:
            return self._send(messages)
        except Exception as error:
            return error


class AsyncCoalescer:
    """`schedule` calls from several tasks of one event loop in shared requests, each sent by
    ``send`` (the client's ``schedule_many``) in a task of this coalescer's own, so that a
    caller cancelled while its request is out cancels nobody else's message."""

    def __init__(self, send: Callable[[list[Message]], Awaitable[list[Scheduled]]], *,
                 max_requests: int = MAX_REQUESTS, max_msgs: int = MAX_MSGS,
                 max_bytes: int = MAX_BYTES) -> None:
        self._send = send
        self._max_requests, self._max_msgs, self._max_bytes = max_requests, max_msgs, max_bytes
        self._waiting: deque[_Call] = deque()
        self._sending: set[asyncio.Task[None]] = set()

    async def schedule(self, message: Message) -> Scheduled:
        answered = asyncio.get_running_loop().create_future()
        call = _Call(message, size_bytes(message), answered=answered)
        self._waiting.append(call)
        self._start()
        try:
            await answered
        except asyncio.CancelledError:  # not sent if it still waits; else it is on its way
            if call in self._waiting:
                self._waiting.remove(call)
            raise
        return call.result()

    async def wait_sent(self) -> None:
        """Until every shared request on its way is answered (the client closes after)."""
        while self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)

    def _start(self) -> None:
        while len(self._sending) < self._max_requests and self._waiting:
            task = asyncio.create_task(
                self._send_batch(take(self._waiting, self._max_msgs, self._max_bytes)))
            self._sending.add(task)
            task.add_done_callback(self._sent_one)

    def _sent_one(self, task: asyncio.Task[None]) -> None:
        self._sending.discard(task)
        self._start()

    async def _send_batch(self, batch: list[_Call]) -> None:
        try:
            if not settle(batch, await self._sent([call.message for call in batch])):
                for call in batch:
                    settle([call], await self._sent([call.message]))
        finally:
            for call in batch:
                answered = call.answered
                if answered is not None and not answered.done():
                    if not call.done:  # this task was cancelled (the client closed)
                        call.error = asyncio.CancelledError()
                    answered.set_result(None)

    async def _sent(self, messages: list[Message]) -> list[Scheduled] | Exception:
        try:
            return await self._send(messages)
        except Exception as error:
            return error
