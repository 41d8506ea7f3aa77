"""Waiting on the event loop for what the replica commits, in bounded time: a request never
hangs on a leader that lost its majority; it answers ``UNAVAILABLE`` and the client retries
(ids, receipts and handles make every write safe to repeat)."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from typing import TypeVar

from tickwheel.common.errors import Retryable
from tickwheel.replication import Rejected

WRITE_TIMEOUT_S = 10.0
"""How long a request waits for its command to be committed and applied."""

_T = TypeVar("_T")


async def applied(future: Future[_T]) -> _T:
    """A replicated command's result; `Retryable` if it is not applied in time."""
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), WRITE_TIMEOUT_S)
    except TimeoutError:
        raise Retryable("not committed in time; retry") from None


async def committed(future: Future[list[_T]]) -> list[_T]:
    """A replicated write's results, one per item; raises the error of the first item the
    state machine rejected."""
    results = await applied(future)
    for result in results:
        if isinstance(result, Rejected):
            raise result.error
    return results
