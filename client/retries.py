"""How the clients try a call again (tenacity's arguments), shared by `Client`, `AsyncClient`
and their consumers.

Every call this library makes is safe to repeat (ids make scheduling idempotent, cancels
are), so a retryable failure (`tickwheel.client.errors.retryable`) is tried again within the
call's ``timeout_s``: after a jittered back-off of at most 250 ms (a leader change), or,
when the node's refusal says when a retry may pass (a ``RetryInfo``: the caller is over a
quota, docs/security.md), after that long. A wait the node advised that would end past the
deadline is not waited for: the call fails at once with the refusal (`QuotaExceeded`).
Consumers reconnect without a deadline, waiting as advised too.
"""

from __future__ import annotations

import random
from typing import TypedDict

from tenacity import RetryCallState, retry_if_exception, stop_after_delay, wait_random_exponential
from tenacity.retry import retry_base
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from tickwheel.client.errors import retry_advice, retryable

RECONNECT_WAIT = wait_random_exponential(multiplier=0.05, max=0.25)
"""Between attempts: jittered, growing from 50 ms to at most 250 ms. An election takes about a
second; a longer back-off would only add to the time without delivery after it."""
ADVISED_JITTER = 0.1
"""An advised wait is lengthened by up to this part of it, at random, so that callers refused
together do not all come back at the same moment (never shortened: the node said when)."""


class wait_as_advised(wait_base):
    """The wait a refusal advises (its ``RetryInfo``), when the last failure carries one;
    ``otherwise``'s when it does not."""

    def __init__(self, otherwise: wait_base) -> None:
        self._otherwise = otherwise

    def __call__(self, retry_state: RetryCallState) -> float:
        advice = retry_advice(_failure(retry_state))
        if advice is None:
            return self._otherwise(retry_state)
        return advice.retry_after_ms / 1000 * (1 + random.random() * ADVISED_JITTER)


class stop_past_deadline(stop_base):
    """Stop when the wait a refusal advises would end after ``timeout_s`` from the first try:
    waiting would only fail later. Never for a failure without advice (`stop_after_delay`
    decides those, as before advice was read)."""

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s

    def __call__(self, retry_state: RetryCallState) -> bool:
        if retry_advice(_failure(retry_state)) is None:
            return False
        elapsed_s = retry_state.seconds_since_start or 0.0
        return elapsed_s + retry_state.upcoming_sleep > self._timeout_s


CONSUMER_WAIT = wait_as_advised(RECONNECT_WAIT)
"""Between a consumer's attempts to open its stream again."""


class RetryPolicy(TypedDict):
    """The arguments of tenacity's ``Retrying`` and ``AsyncRetrying`` for a call."""

    retry: retry_base
    wait: wait_base
    stop: stop_base
    reraise: bool


def retry_policy(timeout_s: float) -> RetryPolicy:
    """tenacity arguments: retryable codes tried again for up to ``timeout_s``, after a
    jittered exponential back-off or the wait the node advised."""
    return {"retry": retry_if_exception(retryable), "wait": wait_as_advised(RECONNECT_WAIT),
            "stop": stop_after_delay(timeout_s) | stop_past_deadline(timeout_s),
            "reraise": True}


def _failure(retry_state: RetryCallState) -> BaseException | None:
    outcome = retry_state.outcome
    return outcome.exception() if outcome is not None and outcome.failed else None
