"""What the console's pages show, read from the cluster through the client library alone.

The cluster page asks every member for its own view (`Client.cluster_info` with a target) at
once, so a member that is down shows as unreachable while the others answer, and the leader is
the one that says it leads in the highest term; `LeaderTimeline` keeps the changes of leader a
session has seen. The topics and groups come from the leader's answer (its due and unacked
counts are the leader's own), the histogram from `Client.due_histogram`. Pure reads, no state
but the timeline: `tickwheel.console.pages` and `tickwheel.console.live` call them (on worker
threads: the client blocks).
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from tickwheel.client import (
    Client,
    ClusterInfo,
    DueHistogram,
    GroupInfo,
    Member,
    TickwheelClientError,
    TopicDue,
    TopicPending,
)

_ASKING = ThreadPoolExecutor(max_workers=16, thread_name_prefix="console-ask")
"""Where the members are asked at once: one call a member, each bounded by the client's
attempt timeout."""
TIMELINE_LENGTH = 20


@dataclass(frozen=True, slots=True)
class MemberView:
    """One member as it answers for itself (or not)."""

    grpc_address: str
    answered: bool
    role: str = "unreachable"
    shard: int = 0
    raft_address: str = ""
    term: int = 0
    commit_index: int = 0
    last_applied: int = 0
    cursor_second: int = 0
    lag_entries: int = 0
    """Behind the leader's commit index, as the leader counts it."""
    error: str = ""
    clock: str = ""
    """Its clock's offset from the leader's, as the leader estimates it ("" if unknown)."""
    disk: str = ""
    """Its free disk space and reserve, as the leader last heard them ("" if unknown)."""


@dataclass(frozen=True, slots=True)
class LeaderChange:
    at_ms: int
    leader: str
    """Its gRPC address ("" while none is known)."""
    term: int

    @property
    def at(self) -> str:
        return _utc(self.at_ms, "%H:%M:%S")


@dataclass
class LeaderTimeline:
    """The leaders a session has seen, newest first, at most `TIMELINE_LENGTH`."""

    changes: deque[LeaderChange] = field(default_factory=lambda: deque(maxlen=TIMELINE_LENGTH))

    def observe(self, leader: str, term: int, at_ms: int) -> None:
        last = self.changes[0] if self.changes else None
        if (last is None and leader) or (last is not None and (last.leader, last.term) != (
                leader, term)):
            self.changes.appendleft(LeaderChange(at_ms, leader, term))


@dataclass
class DeliveryRates:
    """Messages delivered a second per topic, from the leader's counts in two answers a
    session read (none across a change of leader: its counts start again)."""

    leader: str = ""
    at_s: float = 0.0
    delivered: dict[str, int] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)

    def observe(self, leader: str, info: ClusterInfo, at_s: float) -> None:
        counts = {topic.topic: topic.delivered for topic in info.topics}
        if leader and leader == self.leader and at_s > self.at_s:
            self.rates = {topic: max(0, count - self.delivered.get(topic, count)) / (
                at_s - self.at_s) for topic, count in counts.items()}
        else:
            self.rates = {}
        self.leader, self.at_s, self.delivered = leader, at_s, counts


@dataclass(frozen=True, slots=True)
class ClusterView:
    members: tuple[MemberView, ...]
    leader: str
    """The leader's gRPC address ("shard 0: ... · shard 1: ..." with several shards), "" if
    no member says it leads."""
    term: int
    info: ClusterInfo | None
    """The leaders' answers (else any member's) for topics, groups and the cursor, every
    shard's added up (`merge_infos`)."""
    changes: tuple[LeaderChange, ...]
    rates: dict[str, float] = field(default_factory=dict)
    """Delivered a second per topic, since the session's last read."""


def read_cluster(client: Client, addresses: Iterable[str], timeline: LeaderTimeline,
                 rates: DeliveryRates) -> tuple[ClusterView, set[str]]:
    """Ask every member in ``addresses`` (and those their answers name) for its view; returns
    the view and every member address now known."""
    known = sorted(set(addresses))
    answers = dict(zip(known, _ASKING.map(lambda a: _ask(client, a), known), strict=True))
    for info in [a for a in answers.values() if isinstance(a, ClusterInfo)]:
        for member in info.members:
            if member.grpc_address not in answers:
                answers[member.grpc_address] = _ask(client, member.grpc_address)
    infos = {a: i for a, i in answers.items() if isinstance(i, ClusterInfo)}
    leaders: dict[int, tuple[str, ClusterInfo]] = {}
    for address, info in infos.items():  # each shard's, in the highest term
        if info.role == "leader" and info.term >= leaders.get(info.shard, ("", info))[1].term:
            leaders[info.shard] = (address, info)
    seen = {m.grpc_address: m for _, info in leaders.values() for m in info.members}
    members = tuple(_member(address, answer, seen.get(address))
                    for address, answer in sorted(answers.items()))
    leader = " · ".join(f"shard {shard}: {address}" if len(leaders) > 1 else address
                        for shard, (address, _) in sorted(leaders.items()))
    term = max((i.term for _, i in leaders.values()), default=0) if leaders else max(
        (i.term for i in infos.values()), default=0)
    timeline.observe(leader, term, time.time_ns() // 1_000_000)
    shown = merge_infos([i for _, (_, i) in sorted(leaders.items())]) or next(
        iter(infos.values()), None)
    if leaders and shown is not None:
        rates.observe(leader, shown, time.monotonic())
    return ClusterView(members, leader, term, shown, tuple(timeline.changes),
                       dict(rates.rates)), set(answers)


def _ask(client: Client, address: str) -> ClusterInfo | str:
    try:
        return client.cluster_info(target=address)
    except TickwheelClientError as error:
        return error.code.name


def _member(address: str, answer: ClusterInfo | str, seen: Member | None) -> MemberView:
    """``address`` as it answered, with what the leader says of it (``seen``)."""
    clock = disk = ""
    if seen is not None and seen.clock_known:
        clock = f"{seen.clock_offset_ms:+d} ms (± {seen.clock_error_ms} ms)"
    if seen is not None and seen.disk_known:
        disk = f"{_size(seen.free_bytes)} free, reserve {_size(seen.reserve_bytes)}"
    lag = seen.lag_entries if seen is not None else 0
    if isinstance(answer, str):
        return MemberView(address, answered=False, error=answer, clock=clock, disk=disk)
    return MemberView(address, True, answer.role, answer.shard, answer.address, answer.term,
                      answer.commit_index, answer.last_applied, answer.cursor_second, lag,
                      clock=clock, disk=disk)


def merge_infos(infos: Sequence[ClusterInfo]) -> ClusterInfo | None:
    """The shards' leaders' answers as one: the first's, with every shard's topics, pending
    counts and groups added up by name."""
    if len(infos) <= 1:
        return infos[0] if infos else None
    due: dict[str, list[int]] = {}
    pending: dict[str, int] = {}
    groups: dict[tuple[str, str], list[int]] = {}
    for info in infos:
        for t in info.topics:
            _add(due.setdefault(t.topic, [0] * 4), (t.ready, t.unacked, t.consumers, t.delivered))
        for p in info.pending:
            pending[p.topic] = pending.get(p.topic, 0) + p.pending
        for g in info.groups:
            _add(groups.setdefault((g.topic, g.group), [0] * 4),
                 (g.ready, g.leased, g.consumers, g.dropped))
    return dataclasses.replace(
        infos[0], topics=tuple(TopicDue(t, *n) for t, n in sorted(due.items())),
        pending=tuple(TopicPending(t, n) for t, n in sorted(pending.items())),
        groups=tuple(GroupInfo(t, g, *n) for (t, g), n in sorted(groups.items())),
        pending_untracked=sum(i.pending_untracked for i in infos))


def _add(sums: list[int], values: tuple[int, ...]) -> None:
    for i, value in enumerate(values):
        sums[i] += value


def _size(size_bytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size_bytes < 1024:
            return f"{size_bytes} {unit}"
        size_bytes //= 1024
    return f"{size_bytes} TiB"


@dataclass(frozen=True, slots=True)
class Bucket:
    index: int
    start_ms: int
    count: int
    label: str
    height_pct: float
    """Of the tallest bucket's, for the bar."""


@dataclass(frozen=True, slots=True)
class HistogramView:
    span: str
    histogram: DueHistogram
    buckets: tuple[Bucket, ...]

    @property
    def total(self) -> int:
        return sum(self.histogram.counts)


def read_histogram(client: Client, span: str, topic: str = "") -> HistogramView:
    """Every shard's histogram of ``span`` (``topic``'s alone, if given), added up
    (`merge`)."""
    histogram = merge([client.due_histogram(span, shard=shard, topic=topic)
                       for shard in range(client.shards().count)])
    tallest = max(histogram.counts, default=0) or 1
    buckets = tuple(
        Bucket(i, start_ms, count, _label(span, i, start_ms), 100.0 * count / tallest)
        for i, count in enumerate(histogram.counts)
        for start_ms in [histogram.start_ms + i * histogram.bucket_ms])
    return HistogramView(span, histogram, buckets)


def merge(histograms: list[DueHistogram]) -> DueHistogram:
    """The shards' histograms as one, on the first one's buckets: another shard's node may
    have begun its buckets a second (or an hour) apart, so its counts move by as many
    buckets, into ``overdue`` or ``beyond`` past either end; pending totals add up."""
    first, *others = histograms
    counts = list(first.counts)
    overdue, beyond = first.overdue, first.beyond
    pending = {p.topic: p.pending for p in first.pending}
    for other in others:
        shift = (other.start_ms - first.start_ms) // first.bucket_ms
        overdue, beyond = overdue + other.overdue, beyond + other.beyond
        for index, count in enumerate(other.counts):
            where = index + shift
            if where < 0:
                overdue += count
            elif where >= len(counts):
                beyond += count
            else:
                counts[where] += count
        for topic in other.pending:
            pending[topic.topic] = pending.get(topic.topic, 0) + topic.pending
    return DueHistogram(first.now_ms, first.start_ms, first.bucket_ms, tuple(counts), overdue,
                        beyond, first.cursor_second,
                        tuple(TopicPending(t, n) for t, n in sorted(pending.items())),
                        sum(h.pending_untracked for h in histograms), first.topic)


def _label(span: str, index: int, start_ms: int) -> str:
    if span == "minute":
        return f"+{index} s"
    if span == "hour":
        return f"+{index} min"
    if span == "day":
        return _utc(start_ms, "%H:00")
    return _utc(start_ms, "%Y-%m-%d")


def _utc(at_ms: int, form: str) -> str:
    return datetime.datetime.fromtimestamp(at_ms / 1_000, datetime.UTC).strftime(form)
