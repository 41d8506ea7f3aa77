"""What a principal may do at most, enforced: the access file's ``[principal.quota]``
(`tickwheel.node.security.access.Quota`) held against what the principal does on this node.

A shared cluster serves several teams; Kafka's client quotas and Pulsar's publish rate limits
are the model. The rule kept here: **a principal over a quota is refused
(`QuotaExceeded`, gRPC ``RESOURCE_EXHAUSTED`` with a ``RetryInfo``) and nobody else sees a
change**, since every count is the principal's own; a principal without a quota is never
counted against anything.

- **Rates** (``schedule_msgs_per_s``, ``schedule_bytes_per_s``): a token bucket per principal
  (`TokenBucket`), on the leader, where every schedule is authorized (a follower forwards it
  with the caller's principal; the RocketMQ listener's sends take the same path). A request
  is admitted whole when each bucket holds its cost, or is full: a request larger than the
  burst is admitted into debt, and the debt is paid before the next one passes, so the
  average rate holds whatever the batch size. The refusal says when the bucket will hold
  the cost.
- **Pending** (``max_pending_msgs``): the replicated pending counts of the topics the
  principal's ``schedule`` grants match, plus what it has on its way to the log here (so
  that concurrent requests cannot overshoot together). Read, not replicated: no command or
  snapshot changes. The counts are read at most every `PENDING_READ_MS` (reading them costs
  the replica's status); what the principal had answered since the last read is counted
  with what is on its way, so a cached read never lets it past its quota.
- **Consumer streams** (``max_consumer_streams``): the ``Receive`` streams of the principal
  this node serves (the leader's; a follower passes a stream through to it).

Buckets and counts are this node's, in memory: a new leader starts with full buckets, and a
cluster of several shards holds each shard's leader to the quota apart (as a Kafka broker
does). A quota changed in the access file takes effect at its next call (a bucket whose rate
or burst changed starts full). Thread contract: the node's event loop only.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Never

from tickwheel.common.errors import InvalidMessage, QuotaExceeded
from tickwheel.node.security.access import Action, Principal

log = logging.getLogger("tickwheel.node.quotas")

WAIT_FOR_PENDING_MS = 1_000
"""The retry a ``max_pending_msgs`` refusal advises: pending messages leave as they come due
or are cancelled, which no node can foresee."""
WAIT_FOR_STREAM_MS = 1_000
"""The retry a ``max_consumer_streams`` refusal advises: a stream ends when its consumer
closes it."""
PENDING_READ_MS = 100
"""How long a read of the pending counts serves: they trail deliveries by the cursor sync
(50 ms, and a second is left only once it is closed) anyway."""
LOG_EVERY_MS = 10_000
"""A principal's refusals over one quota are logged at most this often (the rest counted)."""


class TokenBucket:
    """``rate_per_s`` tokens a second, at most ``burst`` held; full at ``now_ms``.

    >>> bucket = TokenBucket(rate_per_s=10, burst=10, now_ms=0)
    >>> bucket.take(10, now_ms=0), bucket.take(1, now_ms=0)
    (0, 100)
    >>> bucket.take(1, now_ms=100), bucket.take(25, now_ms=1_100)  # full: 25 go into debt
    (0, 0)
    >>> bucket.wait_ms(1, now_ms=1_100)  # 15 owed, and 1 more
    1600
    """

    __slots__ = ("_at_ms", "_milli_tokens", "burst", "rate_per_s")

    def __init__(self, rate_per_s: int, burst: int, now_ms: int) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._milli_tokens = burst * 1000
        """Thousandths of a token: a millisecond refills ``rate_per_s`` of them, exactly."""
        self._at_ms = now_ms

    def wait_ms(self, cost: int, now_ms: int) -> int:
        """How long until ``cost`` may be taken (0: now). A cost above the burst waits for a
        full bucket."""
        self._refill(now_ms)
        missing = min(cost, self.burst) * 1000 - self._milli_tokens
        return 0 if missing <= 0 else -(-missing // self.rate_per_s)

    def take(self, cost: int, now_ms: int) -> int:
        """Take ``cost`` if it may be taken now and answer 0; else take nothing and answer
        `wait_ms`."""
        wait_ms = self.wait_ms(cost, now_ms)
        if not wait_ms:
            self._milli_tokens -= cost * 1000
        return wait_ms

    def _refill(self, now_ms: int) -> None:
        if now_ms > self._at_ms:
            self._milli_tokens = min(self.burst * 1000, self._milli_tokens
                                     + (now_ms - self._at_ms) * self.rate_per_s)
            self._at_ms = now_ms


@dataclass(slots=True)
class _Tenant:
    """One principal's state: its buckets (made for the rate and burst in force) and what it
    has on its way to the log."""

    messages: TokenBucket | None = None
    request_bytes: TokenBucket | None = None
    on_the_way_msgs: int = 0
    """Admitted, not yet answered."""
    answered_msgs: int = 0
    """Answered since the pending counts were last read (perhaps not in that read)."""


class Reservation:
    """What an admitted call holds against its principal until `release` (idempotent)."""

    __slots__ = ("_release",)

    def __init__(self, release: Callable[[], None] | None = None) -> None:
        self._release = release

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()


NOTHING_HELD = Reservation()


class Quotas:
    """Every principal's quotas on this node. ``monotonic_ms`` is the injected clock's
    monotonic reading; ``pending`` reads the pending messages per topic (the replica's);
    ``refused`` is told of every refusal (the metrics)."""

    def __init__(self, monotonic_ms: Callable[[], int],
                 pending: Callable[[], Mapping[str, int]],
                 refused: Callable[[QuotaExceeded], None] = lambda error: None) -> None:
        self._monotonic_ms = monotonic_ms
        self._read_pending = pending
        self._pending: Mapping[str, int] = {}
        self._pending_read_ms: int | None = None
        self._refused = refused
        self._tenants: dict[str, _Tenant] = {}
        self._streams: Counter[str] = Counter()
        self._logged: dict[tuple[str, str], tuple[int, int]] = {}
        """(principal, quota) -> (when last logged, refusals since)."""

    def admit_schedule(self, principal: Principal, msgs: int,
                       request_bytes: Callable[[], int]) -> Reservation:
        """Admit a schedule request of ``msgs`` messages (``request_bytes``, its encoded size,
        is read only if a quota needs it) or raise `QuotaExceeded`; `InvalidMessage` for a
        request that no wait would let through. The reservation holds its messages as on
        their way to the log until the answer."""
        quota = principal.quota
        if not quota.bounds():
            return NOTHING_HELD
        tenant = self._tenant(principal)
        if quota.max_pending_msgs is not None:
            self._check_pending(principal, quota.max_pending_msgs, msgs, tenant)
        self._take_rates(principal, tenant, msgs, request_bytes)
        tenant.on_the_way_msgs += msgs

        def release() -> None:
            tenant.on_the_way_msgs -= msgs
            tenant.answered_msgs += msgs
        return Reservation(release)

    def open_stream(self, principal: Principal) -> Reservation:
        """Count a consumer stream of ``principal`` until released, or raise `QuotaExceeded`
        if it has ``max_consumer_streams`` open here already. Streams are counted whatever
        the quota, so that one set later counts the streams already open."""
        name, limit = principal.name, principal.quota.max_consumer_streams
        if limit is not None and self._streams[name] >= limit:
            self._refuse(QuotaExceeded(name, "max_consumer_streams", limit, WAIT_FOR_STREAM_MS,
                                       f" ({self._streams[name]} open on this node)"))
        self._streams[name] += 1

        def release() -> None:
            self._streams[name] -= 1
            if not self._streams[name]:
                del self._streams[name]
        return Reservation(release)

    def _tenant(self, principal: Principal) -> _Tenant:
        """``principal``'s state, its buckets made again where the rate or burst in force
        changed (a new one starts full), dropped where the quota is gone."""
        tenant = self._tenants.get(principal.name)
        if tenant is None:
            tenant = self._tenants[principal.name] = _Tenant()
        quota, now_ms = principal.quota, self._monotonic_ms()
        tenant.messages = _bucket(tenant.messages, quota.schedule_msgs_per_s,
                                  quota.schedule_burst_msgs, now_ms)
        tenant.request_bytes = _bucket(tenant.request_bytes, quota.schedule_bytes_per_s,
                                       quota.schedule_burst_bytes, now_ms)
        return tenant

    def _check_pending(self, principal: Principal, limit: int, msgs: int,
                       tenant: _Tenant) -> None:
        if msgs > limit:
            raise InvalidMessage("messages", f"has {msgs} messages, above max_pending_msgs "
                                 f"({limit}) of principal {principal.name!r}: split the batch")
        by_topic = self._pending_by_topic()
        pending = tenant.on_the_way_msgs + tenant.answered_msgs + sum(
            count for topic, count in by_topic.items()
            if principal.may(Action.SCHEDULE, topic))
        if pending + msgs > limit:
            self._refuse(QuotaExceeded(principal.name, "max_pending_msgs", limit,
                                       WAIT_FOR_PENDING_MS, f" ({pending} pending in its "
                                       f"topics, {msgs} more asked)"))

    def _pending_by_topic(self) -> Mapping[str, int]:
        """The pending counts, read again if the last read is `PENDING_READ_MS` old; a new
        read holds every answer given before it (a schedule is answered once applied)."""
        now_ms = self._monotonic_ms()
        if self._pending_read_ms is None or now_ms - self._pending_read_ms >= PENDING_READ_MS:
            self._pending, self._pending_read_ms = self._read_pending(), now_ms
            for tenant in self._tenants.values():
                tenant.answered_msgs = 0
        return self._pending

    def _take_rates(self, principal: Principal, tenant: _Tenant, msgs: int,
                    request_bytes: Callable[[], int]) -> None:
        """Take from both buckets, or from neither and refuse naming the first that waits,
        with the longer wait (a retry then passes both)."""
        now_ms = self._monotonic_ms()
        asked: list[tuple[TokenBucket, int, str]] = []
        if tenant.messages is not None:
            asked.append((tenant.messages, msgs, "schedule_msgs_per_s"))
        if tenant.request_bytes is not None:
            asked.append((tenant.request_bytes, request_bytes(), "schedule_bytes_per_s"))
        refusing = [(wait_ms, bucket, name) for bucket, cost, name in asked
                    if (wait_ms := bucket.wait_ms(cost, now_ms))]
        if refusing:
            _, bucket, name = refusing[0]
            self._refuse(QuotaExceeded(principal.name, name, bucket.rate_per_s,
                                       max(wait_ms for wait_ms, _, _ in refusing)))
        for bucket, cost, _ in asked:
            bucket.take(cost, now_ms)

    def _refuse(self, error: QuotaExceeded) -> Never:
        """Count and log (at most every `LOG_EVERY_MS` per principal and quota) ``error``,
        then raise it."""
        self._refused(error)
        key, now_ms = (error.principal, error.quota), self._monotonic_ms()
        logged_ms, since = self._logged.get(key, (None, 0))
        if logged_ms is not None and now_ms - logged_ms < LOG_EVERY_MS:
            self._logged[key] = (logged_ms, since + 1)
            raise error
        self._logged[key] = (now_ms, 0)
        log.warning("event=quota_exceeded principal=%s quota=%s limit=%d retry_after_ms=%d "
                    "not_logged_since_last=%d", error.principal, error.quota,
                    error.quota_value, error.retry_after_ms, since)
        raise error


def _bucket(bucket: TokenBucket | None, rate_per_s: int | None, burst: int | None,
            now_ms: int) -> TokenBucket | None:
    """The bucket for ``rate_per_s`` and ``burst`` (default: a second's worth): ``bucket``
    if it is that one already, a new full one if not, None without a rate."""
    if rate_per_s is None:
        return None
    burst = rate_per_s if burst is None else burst
    if bucket is not None and bucket.rate_per_s == rate_per_s and bucket.burst == burst:
        return bucket
    return TokenBucket(rate_per_s, burst, now_ms)
