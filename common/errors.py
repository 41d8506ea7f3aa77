"""Every error tickwheel raises on purpose, in one tree.

::

    TickwheelError
    ├── ClientError             the caller can fix it; names the field at fault
    │   ├── InvalidMessage      a message field is malformed or over a limit
    │   ├── UnknownHandle       a handle that no scheduling ever returned
    │   ├── ConsumerNotAcking   a consumer stream let its messages' visibility timeouts
    │   │                       run out and acknowledged none of them
    │   ├── VersionConflict     the cluster's version does not allow it yet (or a member
    │   │                       holds a finalize back); names the member
    │   └── PermissionDenied    the caller may not do this to this topic or group
    ├── Unauthenticated         no credentials, or credentials nobody issued
    ├── StorageLocked           another process has the data folder open
    ├── StorageIncomplete       stored state the node needs is missing; it will not start
    ├── Retryable               try again, maybe elsewhere
    │   ├── NotLeader           this node cannot order writes; ``leader_hint`` says who can
    │   └── Overloaded          a bounded queue is full
    │       ├── ConsumerStalled a consumer stream did not read what was sent to it
    │       └── QuotaExceeded   a principal is over a quota its access file sets;
    │                           ``retry_after_ms`` says when a retry may pass
    └── InternalError           a bug or damaged storage; never the caller's fault
        ├── CorruptSegment      stored bytes fail their CRC or framing
        └── InvariantViolation  a rule that must never break did; the node must stop

The API edge maps the whole tree to gRPC status codes in one table.
"""

from __future__ import annotations


class TickwheelError(Exception):
    """Root of every error tickwheel raises on purpose."""


class ClientError(TickwheelError):
    """The request was wrong; ``field`` names what to fix."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class InvalidMessage(ClientError):
    """A message field is malformed or beyond a limit."""


class UnknownHandle(ClientError):
    """A cancel named a handle that no scheduling returned."""


class WrongShard(ClientError):
    """A message, handle or receipt of another shard was sent to this one: the caller's shard
    map is not the cluster's (gRPC ``FAILED_PRECONDITION``; read the map again)."""


class MapConflict(ClientError):
    """A change of the shard map that does not follow from the map in force (gRPC
    ``FAILED_PRECONDITION``)."""


class ConsumerNotAcking(ClientError):
    """A consumer stream acknowledged nothing while the visibility timeout of
    ``max_unacked_timeouts`` of its messages ran out: it is closed (gRPC
    ``FAILED_PRECONDITION``: reconnecting as it is would hold the next messages the same
    way), and its messages go to the other consumers of its group."""

    def __init__(self, consumer: str, timeouts: int, visibility_timeout_ms: int) -> None:
        super().__init__("ack", f"consumer {consumer!r} acknowledged none of its messages, and "
                                f"the visibility timeout ({visibility_timeout_ms} ms) of "
                                f"{timeouts} of them ran out (max_unacked_timeouts): the "
                                "stream is closed and its messages go to the other consumers "
                                "of its group; ack each message once handled, or subscribe "
                                "with a longer visibility_timeout_ms")
        self.consumer = consumer
        self.timeouts = timeouts


class VersionConflict(ClientError):
    """What the cluster's version does not allow yet: a format of a later version before the
    upgrade is finalized, or a finalize while a member runs an older release (gRPC
    ``FAILED_PRECONDITION``; `tickwheel.common.versions`)."""


class PermissionDenied(ClientError):
    """The caller is authenticated but its grants do not cover this action on this topic (or
    group); ``field`` names the part of the request refused."""


class Unauthenticated(TickwheelError):
    """The call carried no credentials, or credentials this cluster does not know."""


class StorageLocked(TickwheelError):
    """Another process holds the data folder; two writers would corrupt it."""

    def __init__(self, path: str) -> None:
        super().__init__(f"{path} is locked by another process")
        self.path = path


class StorageIncomplete(TickwheelError):
    """Part of the stored state a node needs is gone (a lost snapshot under a compacted
    journal): it refuses to start rather than serve, vote or lead without it."""


class Retryable(TickwheelError):
    """Not now, or not here: a retry (with back-off) may succeed."""


class NotLeader(Retryable):
    """Only the Raft leader orders writes; ``leader_hint`` is the leader's address if known."""

    def __init__(self, leader_hint: str | None) -> None:
        super().__init__(f"not the leader; leader is {leader_hint or 'unknown'}")
        self.leader_hint = leader_hint


class MapChanged(Retryable):
    """A schedule was checked against a shard map older than the one the shard now takes
    messages by: the node checks it again against the new one."""

    def __init__(self, version: int) -> None:
        super().__init__(f"the shard map changed to version {version} meanwhile; retry")
        self.version = version


class Overloaded(Retryable):
    """A bounded queue is full; ``limit`` names the configured limit that was hit."""

    def __init__(self, limit: str) -> None:
        super().__init__(f"overloaded: {limit} reached")
        self.limit = limit


class ConsumerStalled(Overloaded):
    """A consumer stream did not read what was sent to it: messages waited unsent past their
    visibility timeout. The stream is closed, and its messages go to other consumers."""

    def __init__(self, visibility_timeout_ms: int) -> None:
        Retryable.__init__(self, f"the consumer did not read: messages waited for it longer "
                                   f"than their visibility timeout ({visibility_timeout_ms} ms); "
                                   "they go to other consumers of its group")
        self.limit = "visibility_timeout_ms"


class DiskLow(Overloaded):
    """A member's disk is below its reserve (``min_free_bytes``): new messages wait for space;
    what is stored is still delivered (`tickwheel.node.ops.disk`)."""

    def __init__(self, member: str, free_bytes: int, reserve_bytes: int) -> None:
        Retryable.__init__(self, f"disk space low on {member}: {free_bytes} bytes free, "
                                   f"below its reserve of {reserve_bytes} (min_free_bytes); "
                                   "new messages are refused until space returns, stored "
                                   "ones are still delivered")
        self.limit = "min_free_bytes"
        self.member = member


class QuotaExceeded(Overloaded):
    """A principal is over one of its quotas (the access file's ``[principal.quota]``):
    ``quota`` names the field (and so does ``limit``, as for any `Overloaded`),
    ``quota_value`` is its value, ``retry_after_ms`` when a retry may pass. Other principals
    are not affected (`tickwheel.node.security.quotas`)."""

    def __init__(self, principal: str, quota: str, limit: int, retry_after_ms: int,
                 why: str = "") -> None:
        Retryable.__init__(self, f"quota exceeded: principal {principal!r} is over its "
                                   f"{quota} of {limit}{why}; retry in {retry_after_ms} ms")
        self.limit = quota
        self.principal = principal
        self.quota = quota
        self.quota_value = limit
        self.retry_after_ms = retry_after_ms


class InternalError(TickwheelError):
    """Not the caller's fault: a bug, or storage that was damaged underneath us."""


class CorruptSegment(InternalError):
    """Stored bytes fail their CRC or framing; ``where`` names the file."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where


class InvariantViolation(InternalError):
    """A rule that must never break did. Stop the node rather than corrupt data."""


def invariant(condition: bool, message: str) -> None:
    """Assert ``condition`` in a way ``python -O`` cannot strip."""
    if not condition:
        raise InvariantViolation(message)
