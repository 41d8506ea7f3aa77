"""The details a refusal over a quota carries, as gRPC's richer error model writes them: a
``google.rpc.Status`` in the ``grpc-status-details-bin`` trailer, holding a
``google.rpc.RetryInfo`` (when a retry may pass) and a ``google.rpc.QuotaFailure`` (which
quota, of whom, and its value).

Nodes write it (`quota_details`, at the API edge); the client library reads it
(`RetryAdvice.of`) to wait as long as the node said before trying again. One module, so that
both ends agree on the key and the messages; any gRPC client can read the same trailer
(``grpc_status.rpc_status.from_call`` in Python, ``StatusProto.fromThrowable`` in Java).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

STATUS_DETAILS_KEY = "grpc-status-details-bin"
"""The trailer gRPC's richer error model puts a serialized ``google.rpc.Status`` in."""
RESOURCE_EXHAUSTED = 8
"""``google.rpc.Code.RESOURCE_EXHAUSTED``: the status's code, the call's own."""
PRINCIPAL_SUBJECT = "principal:"
"""``QuotaFailure.Violation.subject`` is this and the principal's name."""


def quota_details(message: str, principal: str, quota: str, limit: int,
                  retry_after_ms: int) -> bytes:
    """The ``grpc-status-details-bin`` value of a ``RESOURCE_EXHAUSTED`` refusal over
    ``principal``'s ``quota`` (of ``limit``): retry in ``retry_after_ms``."""
    status = status_pb2.Status(code=RESOURCE_EXHAUSTED, message=message)
    status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=Duration(
        seconds=retry_after_ms // 1000, nanos=retry_after_ms % 1000 * 1_000_000)))
    status.details.add().Pack(error_details_pb2.QuotaFailure(violations=[
        error_details_pb2.QuotaFailure.Violation(
            subject=PRINCIPAL_SUBJECT + principal, description=message, quota_id=quota,
            quota_value=limit)]))
    return status.SerializeToString()


@dataclass(frozen=True, slots=True)
class RetryAdvice:
    """What a refusal's details say: wait ``retry_after_ms``; and, over a quota, which one
    (``quota``, "" when none is named) and its value."""

    retry_after_ms: int
    quota: str = ""
    quota_value: int = 0

    @classmethod
    def of(cls, trailers: Iterable[tuple[str, str | bytes]] | None) -> RetryAdvice | None:
        """The advice in a call's trailing metadata; None without a ``RetryInfo`` (or with
        details that do not parse: a retry then waits as it would without them)."""
        data = next((value for key, value in trailers or () if key == STATUS_DETAILS_KEY), None)
        if not isinstance(data, bytes):
            return None
        status = status_pb2.Status()
        try:
            status.ParseFromString(data)
        except DecodeError:
            return None
        delay_ms, quota, quota_value = None, "", 0
        info, failure = error_details_pb2.RetryInfo(), error_details_pb2.QuotaFailure()
        for detail in status.details:
            if detail.Unpack(info):  # False (and nothing read) for another kind of detail
                delay = info.retry_delay
                delay_ms = max(0, delay.seconds * 1000 + delay.nanos // 1_000_000)
            elif detail.Unpack(failure) and failure.violations:
                quota = failure.violations[0].quota_id
                quota_value = failure.violations[0].quota_value
        return None if delay_ms is None else cls(delay_ms, quota, quota_value)
