"""Who led when, and how each change of leader went: the failover figures of the audit.

A *failover* is an entry of ``leaders.jsonl`` naming a leader of a shard other than the last
leader named before it for that shard, or the same one in a later term after the runner saw
none (every node restarted and the old leader won again); `find_failovers` finds them and
when leadership was lost, and blames a fault of that shard; the ledgers (`leaderships`) say
when the old leader last delivered and when the new one first delivered and caught up;
`per_fault` sums them up by the fault blamed. The definitions are those of
`tickwheel.chaos.audit`'s module docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

CAUGHT_UP_MS = 100
"""A new leader has caught up once it delivers a message at most this late (its own clock)."""
NO_FAULT = "none"
"""`per_fault`'s key for failovers no fault is blamed for."""

@dataclass(frozen=True, slots=True)
class LeaderChange:
    """A line of ``leaders.jsonl``; ``leader`` is None while the runner sees none."""

    at_ms: int
    leader: str | None
    term: int | None
    shard: int | None = None
    """Whose leader (None: shard 0, in the logs of runs before shards)."""


@dataclass(frozen=True, slots=True)
class Fault:
    """A line of ``faults.jsonl``: what was done to which node (None: every node of the
    shard)."""

    fault: str
    node: str | None
    started_ms: int
    ended_ms: int | None
    detail: str | None
    shard: int | None = None


@dataclass(frozen=True, slots=True)
class Failover:
    """Leadership moved from ``old_leader`` to ``new_leader`` (see the module docstring)."""

    old_leader: str
    new_leader: str
    term: int | None
    at_ms: int
    lost_at_ms: int
    fault: Fault | None
    old_term: int | None = None
    """The term in which the runner first saw the old leader lead, this time."""
    shard: int = 0


@dataclass(frozen=True, slots=True)
class Leadership:
    """What one node's ledgers say about one term: when it took over, first delivered, and
    first delivered a message at most `CAUGHT_UP_MS` late (each None if never)."""

    node_name: str
    term: int
    takeover_ms: int | None
    first_delivered_at_ms: int | None
    caught_up_at_ms: int | None
    last_delivered_at_ms: int | None = None


def find_failovers(changes: list[LeaderChange], faults: list[Fault]) -> list[Failover]:
    """The failovers of every shard in ``changes`` (in time order), each found among its
    shard's changes and blamed on its shard's faults, in the order they happened."""
    shards = sorted({change.shard or 0 for change in changes})
    found = [replace(failover, shard=shard) for shard in shards
             for failover in _shard_failovers(
                 [change for change in changes if (change.shard or 0) == shard],
                 [fault for fault in faults if (fault.shard or 0) == shard])]
    return sorted(found, key=lambda failover: (failover.at_ms, failover.shard))


def _shard_failovers(changes: list[LeaderChange], faults: list[Fault]) -> list[Failover]:
    """The failovers in one shard's ``changes`` (in time order), each with when leadership was
    lost and the fault blamed; ``faults`` in any order. See the module docstring for the
    rules."""
    failovers: list[Failover] = []
    named: tuple[int, str] | None = None  # the latest change that named a leader, and whom
    since: int | None = None  # index of the change that began the named leader's leadership
    for index, change in enumerate(changes):
        if change.leader is None:
            continue
        if named is not None and _is_failover(changes, named[0], index):
            lost_at_ms = _lost_at_ms(changes, named[0], index, faults)
            failovers.append(Failover(
                old_leader=named[1], new_leader=change.leader, term=change.term,
                at_ms=change.at_ms, lost_at_ms=lost_at_ms, fault=_blamed(faults, lost_at_ms),
                old_term=None if since is None else changes[since].term))
            since = index
        named = (index, change.leader)
        since = index if since is None else since
    return failovers


def _is_failover(changes: list[LeaderChange], named: int, index: int) -> bool:
    """Whether ``changes[index]`` ends the leadership last named at ``changes[named]``: another
    leader, or the same one in a later term after an entry naming none."""
    old, new = changes[named], changes[index]
    if new.leader != old.leader:
        return True
    return named + 1 < index and (new.term or 0) > (old.term or 0)


def _lost_at_ms(changes: list[LeaderChange], named: int, index: int,
                faults: list[Fault]) -> int:
    """When the old leader (last named at ``changes[named]``) was lost, for the failover at
    ``changes[index]``."""
    if named + 1 < index:
        return changes[named + 1].at_ms
    started = [fault.started_ms for fault in faults
               if changes[named].at_ms < fault.started_ms <= changes[index].at_ms]
    return max(started, default=changes[index].at_ms)


def _blamed(faults: list[Fault], at_ms: int) -> Fault | None:
    """The latest fault started at or before ``at_ms``."""
    return max((fault for fault in faults if fault.started_ms <= at_ms),
               key=lambda fault: fault.started_ms, default=None)


def leaderships(ledger: DataFrame) -> list[Leadership]:
    """Per node name and term, the ledger figures a failover is measured by (a send's
    ``time_ms`` is when it was sent, a dispatch start's when the node took over)."""
    delivered = F.col("event") == "sent"
    caught_up = delivered & (F.col("time_ms") - F.col("deliver_at_ms") <= CAUGHT_UP_MS)
    rows = ledger.filter(F.col("event").isin("sent", "dispatch_started")).groupBy(
        "node_name", "term").agg(
        F.min(F.when(F.col("event") == "dispatch_started", F.col("time_ms")))
        .alias("takeover_ms"),
        F.min(F.when(delivered, F.col("time_ms"))).alias("first_delivered_at_ms"),
        F.min(F.when(caught_up, F.col("time_ms"))).alias("caught_up_at_ms"),
        F.max(F.when(delivered, F.col("time_ms"))).alias("last_delivered_at_ms")
    ).collect()
    return [Leadership(**row.asDict()) for row in rows]


def _new_leaderships(failover: Failover, leaderships: list[Leadership],
                     until_term: int | None = None) -> list[Leadership]:
    """The new leader's terms from the failover's on (before ``until_term``, the next
    failover's: the leadership this one begins), in term order."""
    term = failover.term or 0
    return sorted((leadership for leadership in leaderships
                   if leadership.node_name == failover.new_leader and leadership.term >= term
                   and (until_term is None or leadership.term < until_term)),
                  key=lambda leadership: leadership.term)


def first_delivered_at_ms(failover: Failover, leaderships: list[Leadership],
                          until_term: int | None = None) -> int | None:
    """The new leader's first send in the failover's term or later (before
    ``until_term``)."""
    return min((leadership.first_delivered_at_ms
                for leadership in _new_leaderships(failover, leaderships, until_term)
                if leadership.first_delivered_at_ms is not None), default=None)


def first_delivery_ms(failover: Failover, leaderships: list[Leadership],
                      until_term: int | None = None) -> int | None:
    first = first_delivered_at_ms(failover, leaderships, until_term)
    return None if first is None else first - failover.lost_at_ms


def last_delivered_at_ms(failover: Failover, leaderships: list[Leadership]) -> int | None:
    """The old leader's last send in the terms of the leadership the failover ends
    (from ``old_term`` to before the failover's), if it delivered any."""
    low, high = failover.old_term, failover.term
    return max((leadership.last_delivered_at_ms for leadership in leaderships
                if leadership.node_name == failover.old_leader
                and leadership.last_delivered_at_ms is not None
                and (low is None or leadership.term >= low)
                and (high is None or leadership.term < high)), default=None)


def gaps_in_turn(failovers: list[Failover], leaderships: list[Leadership]
                 ) -> list[tuple[int | None, int | None]]:
    """``(delivery_gap_ms, the next failover's term)`` of each failover, in order: from when
    the old leader stopped delivering (`last_delivered_at_ms`, else the loss) to the new
    leader's first delivery (None if it never delivered in the leadership the failover
    begins). Each new leadership ends at its shard's next failover, and a leader that delivered
    nothing before it was deposed hands its gap on: the next gap of its shard runs from the
    last delivery before it (a deposed leader's first delivery in a later leadership of its
    own is no end of the gap it left)."""
    nexts: list[int | None] = [None] * len(failovers)
    following: dict[int, int] = {}
    for index in reversed(range(len(failovers))):
        nexts[index] = following.get(failovers[index].shard)
        following[failovers[index].shard] = index
    carried: dict[int, int] = {}
    figures: list[tuple[int | None, int | None]] = []
    for index, failover in enumerate(failovers):
        until = nexts[index]
        until_term = None if until is None else failovers[until].term
        stopped = last_delivered_at_ms(failover, leaderships)
        if stopped is None:
            stopped = carried.pop(failover.shard, failover.lost_at_ms)
        else:
            carried.pop(failover.shard, None)
        first = first_delivered_at_ms(failover, leaderships, until_term)
        if first is None:
            carried[failover.shard] = stopped
        figures.append((None if first is None else first - stopped, until_term))
    return figures


def catch_up_ms(failover: Failover, leaderships: list[Leadership],
                until_term: int | None = None) -> int | None:
    for leadership in _new_leaderships(failover, leaderships, until_term):
        if leadership.takeover_ms is not None:  # the first new leadership that started
            if leadership.caught_up_at_ms is None:
                return None
            return leadership.caught_up_at_ms - leadership.takeover_ms
    return None


def failover_index(failovers: list[Failover]) -> Column:
    """The index of the failover whose window holds ``received_ms`` (null: before the first),
    of ``failovers`` (one shard's, in time order)."""
    received_ms = F.col("received_ms")
    index = F.lit(None).cast("int")
    for number in reversed(range(len(failovers))):
        inside = received_ms >= failovers[number].lost_at_ms
        if number + 1 < len(failovers):
            inside &= received_ms < failovers[number + 1].lost_at_ms
        index = F.when(inside, number).otherwise(index)
    return index


def per_fault(figures: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The audit's failover figures summed up by the fault blamed (`NO_FAULT` for none), in
    order of the name: ``failovers``, ``undelivered`` (no delivery by the new leader), and
    nearest-rank p50, p99 and max of ``no_leader_ms`` and ``delivery_gap_ms``."""
    kinds: dict[str, list[dict[str, Any]]] = {}
    for failover in figures:
        fault = failover["fault"]
        kinds.setdefault(NO_FAULT if fault is None else fault["fault"], []).append(failover)
    return {kind: {"failovers": len(rows),
                   "undelivered": sum(row["delivery_gap_ms"] is None for row in rows),
                   **{name: percentiles([row[name] for row in rows if row[name] is not None])
                      for name in ("no_leader_ms", "delivery_gap_ms")}}
            for kind, rows in sorted(kinds.items())}


def percentiles(values: list[int]) -> dict[str, int | None]:
    """Nearest-rank p50 and p99 of ``values`` (the smallest value that at least that share
    does not exceed), and the maximum; all None without values."""
    ranked = sorted(values)
    if not ranked:
        return {"p50": None, "p99": None, "max": None}
    return {"p50": ranked[math.ceil(0.5 * len(ranked)) - 1],
            "p99": ranked[math.ceil(0.99 * len(ranked)) - 1], "max": ranked[-1]}
