"""The errors of the client library, and the one seam where gRPC's become them::

    TickwheelClientError        a call failed for good; .code is the gRPC status code
    ├── InvalidArgument         the request was wrong; .field names what to fix
    ├── Unavailable             no leader answered (or the cluster was overloaded) in time
    │   └── QuotaExceeded       the caller stayed over a quota of its principal; .quota
    ├── Unauthenticated         the node does not know who is calling
    ├── PermissionDenied        the caller's grants do not cover it; .field names what
    └── RequestTooLarge         above the node's max_request_bytes: split the batch
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import grpc

from tickwheel.common.status_details import RetryAdvice

_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                        grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED,
                        grpc.StatusCode.CANCELLED})
"""Codes a call is tried again on (every call this library makes is safe to repeat: ids make
scheduling idempotent, cancels are). ``CANCELLED`` is among them: this library never cancels
a call it still waits on, so one is a node that stopped (SIGTERM, a rolling restart) with the
call open, or an older node passing that on from its leader."""
_TORN_CONNECTION_DETAILS = ("Internal error from Core", "Received RST_STREAM")
"""How gRPC itself words the ``INTERNAL`` of a connection cut under a call."""


class TickwheelClientError(Exception):
    """A call failed for good (after retries, where retrying was safe). ``code`` is the gRPC
    status code."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class InvalidArgument(TickwheelClientError):
    """The request was wrong; ``field`` names what to fix (``messages[0].topic``)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.field = details.split(":", 1)[0]


class Unavailable(TickwheelClientError):
    """No leader answered in time (or the cluster was overloaded) through every retry."""


class QuotaExceeded(Unavailable):
    """The caller's principal stayed over one of its quotas (``quota``, of ``quota_value``;
    docs/security.md, "Quotas") through every retry, each made when the node said one may
    pass (``retry_after_ms``, its last advice). An `Unavailable`: code that handles an
    overloaded cluster handles this too."""

    def __init__(self, code: grpc.StatusCode, details: str, advice: RetryAdvice) -> None:
        super().__init__(code, details)
        self.quota = advice.quota
        self.quota_value = advice.quota_value
        self.retry_after_ms = advice.retry_after_ms


class Unauthenticated(TickwheelClientError):
    """The node does not know who is calling: no token or client certificate, or one it does
    not know (`tickwheel.client.credentials`). Not retried."""


class PermissionDenied(TickwheelClientError):
    """The caller's grants do not cover this topic or group; ``field`` names what was
    refused. Not retried."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.field = details.split(":", 1)[0]


class RequestTooLarge(TickwheelClientError):
    """The request is larger than the node reads (its ``max_request_bytes``, 8 MiB by
    default): split the batch. Not retried: it would be refused again."""


def translate(error: grpc.RpcError) -> TickwheelClientError:
    """The one seam where gRPC errors become this library's."""
    code, details = error.code(), error.details() or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidArgument(code, details)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return Unauthenticated(code, details)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(code, details)
    if _too_large(error):
        return RequestTooLarge(code, f"{details}: split the batch")
    advice = retry_advice(error)
    if advice is not None and advice.quota:
        return QuotaExceeded(code, details, advice)
    if code in _RETRYABLE or _connection_torn(error):
        return Unavailable(code, details)
    return TickwheelClientError(code, details)


def retryable(error: BaseException) -> bool:
    return isinstance(error, grpc.RpcError) and (
        (error.code() in _RETRYABLE and not _too_large(error)) or _connection_torn(error))


def retry_advice(error: BaseException | None) -> RetryAdvice | None:
    """When a refusal says a retry may pass: the ``RetryInfo`` of a ``RESOURCE_EXHAUSTED``
    (a node's refusal over a quota; `tickwheel.common.status_details`), of ``error`` or of
    the gRPC error it was raised from (a consumer's `Reconnect`)."""
    for candidate in (error, error and error.__cause__):
        if (isinstance(candidate, grpc.RpcError)
                and candidate.code() == grpc.StatusCode.RESOURCE_EXHAUSTED):
            return RetryAdvice.of(trailers(candidate))
    return None


def trailers(error: grpc.RpcError) -> Iterable[tuple[str, str | bytes]] | None:
    """A failed call's trailing metadata; None from an error that is no call (or has none)."""
    try:
        # grpc's stubs type these as objects with .key and .value; gRPC gives (key, value)
        # tuples, as every Call's trailing_metadata() does.
        return cast("Iterable[tuple[str, str | bytes]]", error.trailing_metadata())
    except (AttributeError, ValueError):
        return None


def _connection_torn(error: grpc.RpcError) -> bool:
    """gRPC's own ``INTERNAL`` for a connection torn mid-call (a node killed while a stream
    was open); a node's own ``INTERNAL`` names what failed and is not retried."""
    return (error.code() == grpc.StatusCode.INTERNAL
            and (error.details() or "").startswith(_TORN_CONNECTION_DETAILS))


def _too_large(error: grpc.RpcError) -> bool:
    """gRPC's own refusal of a message above the receiver's limit (it names no field)."""
    return (error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            and "larger than max" in (error.details() or ""))
