"""The client library's retries against a node's advice, without processes: a refusal over a
quota (``RESOURCE_EXHAUSTED`` with a ``RetryInfo``) is tried again after the wait it advises,
within the call's time, and raised as `QuotaExceeded` once that is used up; a refusal without
advice is retried as before. The same against real nodes: tests/security/test_quotas.py."""

from __future__ import annotations

import grpc
import pytest
from tenacity import RetryCallState, Retrying

from tickwheel.client import QuotaExceeded, Unavailable
from tickwheel.client._core import Reconnect
from tickwheel.client.errors import translate
from tickwheel.client.retries import ADVISED_JITTER, CONSUMER_WAIT, retry_policy
from tickwheel.common.status_details import STATUS_DETAILS_KEY, quota_details


class Refused(grpc.RpcError):
    """A failed call as grpcio raises it: a code, details and trailing metadata."""

    def __init__(self, code: grpc.StatusCode, trailers: tuple[tuple[str, str | bytes], ...] = ()
                 ) -> None:
        super().__init__()
        self._code = code
        self._trailers = (("tickwheel-leader", "127.0.0.1:7400"), *trailers)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "refused"

    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._trailers


def over_quota(retry_after_ms: int) -> Refused:
    return Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, ((STATUS_DETAILS_KEY, quota_details(
        "over", "orders", "schedule_msgs_per_s", 10, retry_after_ms)),))


def calls(failures: list[grpc.RpcError], timeout_s: float) -> tuple[list[float], int]:
    """Run a call that fails with ``failures`` in turn, then answers 1, under the library's
    retry policy for ``timeout_s``; the sleeps between its tries (none slept for real) and
    its answer."""
    slept: list[float] = []
    left = list(failures)

    def call() -> int:
        if left:
            raise left.pop(0)
        return 1
    answer = Retrying(sleep=slept.append, **retry_policy(timeout_s))(call)
    return slept, answer


def test_a_refusal_over_a_quota_is_tried_again_after_the_wait_it_advises() -> None:
    slept, answer = calls([over_quota(400), over_quota(1_500)], timeout_s=30)
    assert answer == 1
    assert 0.4 <= slept[0] <= 0.4 * (1 + ADVISED_JITTER)
    assert 1.5 <= slept[1] <= 1.5 * (1 + ADVISED_JITTER)


def test_a_refusal_without_advice_is_tried_again_as_before() -> None:
    slept, answer = calls([Refused(grpc.StatusCode.RESOURCE_EXHAUSTED),
                           Refused(grpc.StatusCode.UNAVAILABLE)], timeout_s=30)
    assert answer == 1
    assert all(wait <= 0.25 for wait in slept)


def test_advice_to_wait_past_the_deadline_fails_at_once_as_quota_exceeded() -> None:
    with pytest.raises(grpc.RpcError) as refused:
        calls([over_quota(5_000)], timeout_s=2)
    error = translate(refused.value)
    assert isinstance(error, QuotaExceeded) and isinstance(error, Unavailable)
    assert (error.quota, error.quota_value, error.retry_after_ms) == (
        "schedule_msgs_per_s", 10, 5_000)
    assert not isinstance(translate(Refused(grpc.StatusCode.RESOURCE_EXHAUSTED)),
                          QuotaExceeded)


def test_a_consumer_refused_a_stream_over_its_quota_reconnects_after_the_advised_wait(
        ) -> None:
    state = RetryCallState(Retrying(), fn=None, args=(), kwargs={})
    try:
        raise Reconnect from over_quota(1_000)
    except Reconnect as reconnect:
        state.set_exception((Reconnect, reconnect, None))
    assert 1.0 <= CONSUMER_WAIT(state) <= 1.0 * (1 + ADVISED_JITTER)
    try:
        raise Reconnect from Refused(grpc.StatusCode.UNAVAILABLE)
    except Reconnect as reconnect:
        state.set_exception((Reconnect, reconnect, None))
    assert CONSUMER_WAIT(state) <= 0.25
