"""Prometheus metrics of one node, served at ``/metrics`` by prometheus-client.

Counters and the lateness histogram are updated where things happen (the gRPC handlers, the
courier); gauges (per-topic queues and consumers, Raft's role, term, cursor lag) are refreshed by
the server's housekeeping task, and a topic that is gone from them is gone from ``/metrics``.
Topic labels are bounded: the first ``max_topic_labels`` topics a node sees get their own label,
and every later one is counted under ``topic="%other%"`` (not a valid topic name), so a client
that makes up topic names cannot grow ``/metrics`` without bound. No label ever carries a
message id; a principal label names one of the access file's principals.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from tickwheel.node.ops.disk import Space
    from tickwheel.replication import GroupSummary, MemberOffset, StepSummary
    from tickwheel.wheel import MendCounts

OTHER_TOPICS = "%other%"
"""The label of every topic beyond ``max_topic_labels``."""
DEFAULT_GROUP_LABEL = "%default%"
"""The group label of a topic's default group (named ``""``, which Prometheus reads as no
label); not a valid group name. Every group of a topic counted under `OTHER_TOPICS` is
counted under ``group="%other%"``."""
LATENESS_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                      10.0, 30.0, 60.0)
_LATENESS_BUCKETS_MS = tuple(round(bound * 1000, 1) for bound in LATENESS_BUCKETS_S)


class BatchHistogram(Collector):
    """A histogram with one label, observed a batch at a time: one lock and one bisect per
    value, where prometheus-client's `Histogram.observe` costs a call, a lock and a scan of the
    buckets per value (a tenth of the delivery path at 20,000 msg/s). Values are observed in
    milliseconds and exported in seconds; a label value stays exported once observed."""

    def __init__(self, name: str, documentation: str, label: str,
                 bounds_ms: tuple[float, ...]) -> None:
        self._name = name
        self._documentation = documentation
        self._label = label
        self._bounds_ms = bounds_ms
        self._counts: dict[str, list[int]] = {}
        self._sums_ms: dict[str, int] = {}
        self._lock = threading.Lock()

    def observe_ms(self, label: str, values_ms: list[int]) -> None:
        where = bisect.bisect_left
        bounds = self._bounds_ms
        with self._lock:
            counts = self._counts.get(label)
            if counts is None:
                counts = self._counts[label] = [0] * (len(bounds) + 1)
                self._sums_ms[label] = 0
            for value_ms in values_ms:
                counts[where(bounds, value_ms)] += 1
            self._sums_ms[label] += sum(values_ms)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            figures = [(label, list(counts), self._sums_ms[label])
                       for label, counts in self._counts.items()]
        family = HistogramMetricFamily(self._name, self._documentation, labels=[self._label])
        for label, counts, sum_ms in figures:
            cumulative, buckets = 0, []
            for bound_ms, count in zip((*self._bounds_ms, float("inf")), counts, strict=True):
                cumulative += count
                buckets.append((str(bound_ms / 1000) if bound_ms != float("inf") else "+Inf",
                                cumulative))
            family.add_metric([label], buckets, sum_ms / 1000)
        yield family


class RaftSteps(Collector):
    """The Raft thread's steps (`ReplicaStatus.raft_steps`), as the housekeeping last read
    them: a histogram and the longest step lately."""

    def __init__(self) -> None:
        self.summary: StepSummary | None = None

    def collect(self) -> Iterator[HistogramMetricFamily | GaugeMetricFamily]:
        summary = self.summary
        if summary is None or not summary.counts:
            return
        cumulative, buckets = 0, []
        for bound_ms, count in zip((*summary.bounds_ms, float("inf")), summary.counts,
                                   strict=True):
            cumulative += count
            buckets.append((str(bound_ms / 1000) if bound_ms != float("inf") else "+Inf",
                            cumulative))
        yield HistogramMetricFamily(
            "tickwheel_raft_step_seconds", "How long the Raft thread worked between two "
            "waits: it answers nothing meanwhile (the election timeout is 0.5 s).",
            buckets=buckets, sum_value=summary.sum_ms / 1000)
        yield GaugeMetricFamily(
            "tickwheel_raft_step_longest_seconds", "The longest Raft-thread step within the "
            "last 5-10 s.", value=summary.longest_ms / 1000)


class TopicLabels:
    """The label a topic is published under: its own name for the first ``max_topics``
    topics seen, `OTHER_TOPICS` for every later one."""

    def __init__(self, max_topics: int) -> None:
        self._max_topics = max_topics
        self._labelled: set[str] = set()

    def __call__(self, topic: str) -> str:
        if topic in self._labelled:
            return topic
        if len(self._labelled) < self._max_topics:
            self._labelled.add(topic)
            return topic
        return OTHER_TOPICS


class Metrics:
    """Every metric a node exports, in its own registry."""

    def __init__(self, max_topic_labels: int = 1_000, shard: int = 0) -> None:
        self.topic = TopicLabels(max_topic_labels)
        """Use ``metrics.delivered.labels(metrics.topic(name))``: the bounded label."""
        self.registry = CollectorRegistry()
        self.registry.set_target_info({"shard": str(shard)})
        """``target_info{shard="K"} 1``: join on it to label any series by shard."""
        r = self.registry
        self.scheduled = Counter("tickwheel_scheduled_messages", "Messages newly scheduled "
                                 "(retried ids not counted again).", registry=r)
        self.cancelled = Counter("tickwheel_cancelled_messages", "Messages cancelled while "
                                 "pending.", registry=r)
        self.rescheduled = Counter("tickwheel_rescheduled_messages", "Messages moved to a "
                                   "new due time while pending.", registry=r)
        self.rejected = Counter("tickwheel_rejected_requests", "Requests refused, by gRPC "
                                "status code.", ["code"], registry=r)
        self.quota_refusals = Counter("tickwheel_quota_refusals", "Calls refused because "
                                      "their principal was over a quota of its access file, "
                                      "by principal and quota (principals are the access "
                                      "file's: the labels are bounded).",
                                      ["principal", "quota"], registry=r)
        self.delivered = Counter("tickwheel_delivered_messages", "Deliveries to consumers, "
                                 "every attempt.", ["topic"], registry=r)
        self.redelivered = Counter("tickwheel_redelivered_messages", "Messages released "
                                   "unacknowledged by a closing stream: ready again at once.",
                                   ["topic"], registry=r)
        self.retried = Counter("tickwheel_retried_messages", "Retry copies filed after a nack "
                               "or a visibility timeout, by the nacked message's topic.",
                               ["topic"], registry=r)
        self.dead_lettered = Counter("tickwheel_dead_lettered_messages", "Messages sent to "
                                     "their topic's %DLQ% topic after the last attempt.",
                                     ["topic"], registry=r)
        self.acked = Counter("tickwheel_acked_messages", "Messages acknowledged.", ["topic"],
                             registry=r)
        self.refused_receipts = Counter("tickwheel_refused_receipts", "Acks with a receipt "
                                        "of another group, never granted, or no longer "
                                        "current: nothing changed.", registry=r)
        self.dropped = Gauge("tickwheel_group_dropped_messages", "Ready messages a consumer "
                             "group dropped past max_ready_msgs (replicated).", ["topic"],
                             registry=r)
        self.group_ready = Gauge("tickwheel_group_ready_messages", "Due messages waiting for "
                                 "a consumer of the group (replicated).", ["topic", "group"],
                                 registry=r)
        self.group_unacked = Gauge("tickwheel_group_unacked_messages", "Messages delivered to "
                                   "the group and not yet acknowledged (replicated).",
                                   ["topic", "group"], registry=r)
        self.lateness = BatchHistogram("tickwheel_delivery_lateness_seconds", "First delivery "
                                       "time minus due time, by topic.", "topic",
                                       _LATENESS_BUCKETS_MS)
        r.register(self.lateness)
        self.consumers = Gauge("tickwheel_consumers", "Open consumer streams.", ["topic"],
                               registry=r)
        self.ready = Gauge("tickwheel_ready_messages", "Due messages waiting for a consumer.",
                           ["topic"], registry=r)
        self.unacked = Gauge("tickwheel_unacked_messages", "Delivered messages waiting for an "
                             "acknowledgement.", ["topic"], registry=r)
        self.pending = Gauge("tickwheel_pending_messages", "Messages scheduled and not yet "
                             "cancelled nor done, per tracked topic (replicated: any node).",
                             ["topic"], registry=r)
        self.pending_untracked = Gauge("tickwheel_pending_untracked_messages", "Pending "
                                       "messages of topics beyond max_tracked_topics.",
                                       registry=r)
        self.is_leader = Gauge("tickwheel_is_leader", "1 on the leader, else 0.", registry=r)
        self.term = Gauge("tickwheel_raft_term", "The Raft term this node is in.", registry=r)
        self.shard_map_version = Gauge("tickwheel_shard_map_version", "The version of the "
                                       "shard map this node takes messages by (1, plus 1 per "
                                       "growth).", registry=r)
        self.commit_index = Gauge("tickwheel_raft_commit_index", "Raft commit index.",
                                  registry=r)
        self.cursor_lag = Gauge("tickwheel_cursor_lag_seconds", "On the leader: now minus the "
                                "cursor's second, while messages are due.", registry=r)
        self.member_lag = Gauge("tickwheel_member_lag_entries", "On the leader: how many "
                                "committed entries each other member is behind (the commit "
                                "index minus the last entry the member is known to hold).",
                                ["member"], registry=r)
        self.leader_changes = Counter("tickwheel_leader_changes", "Times this node saw the "
                                      "leader change.", registry=r)
        self.storage_mended = Gauge("tickwheel_storage_mended", "Damaged stored bytes found "
                                    "since the node started: index units and records rewritten "
                                    "from a peer's good copy (kind unit, record), and attempts "
                                    "no copy could mend (kind unmended).", ["kind"], registry=r)
        self.storage_damage_held = Gauge("tickwheel_storage_damage_held", "1 while the "
                                         "leader's dispatch waits at damaged bytes until a peer "
                                         "can give a good copy.", registry=r)
        self.disk_free = Gauge("tickwheel_disk_free_bytes", "Free disk space under each "
                               "member's data folder, this node's own and the others' last "
                               "answers.", ["member"], registry=r)
        self.disk_reserve = Gauge("tickwheel_disk_reserve_bytes", "Each member's "
                                  "min_free_bytes.", ["member"], registry=r)
        self.clock_offset = Gauge("tickwheel_member_clock_offset_seconds", "On the leader: each "
                                  "member's clock minus the leader's, as the leader estimates "
                                  "it from the member's latest answer (at least this).",
                                  ["member"], registry=r)
        self.clock_error = Gauge("tickwheel_member_clock_error_seconds", "On the leader: how "
                                 "much more the member's offset may be (the round trip of its "
                                 "latest answer).", ["member"], registry=r)
        self.disk_low = Gauge("tickwheel_disk_low", "1 while new messages are refused because "
                              "a member's free space is below its reserve.", registry=r)
        self.raft_steps = RaftSteps()
        """``metrics.raft_steps.summary = status.raft_steps``: the housekeeping's read."""
        r.register(self.raft_steps)
        self.delivered_totals: dict[str, int] = {}
        """Messages sent by bounded topic label, as ``tickwheel_delivered_messages`` counts
        them: what ``ClusterInfo`` tells (`delivered_of`)."""

    def observe_delivered(self, topic: str, count: int, first_lateness_ms: list[int]) -> None:
        """``count`` messages of ``topic`` sent; ``first_lateness_ms``: how late the first
        attempts among them went out (a retry is late by design, so it is not observed)."""
        label = self.topic(topic)
        self.lateness.observe_ms(label, first_lateness_ms)
        self.delivered.labels(label).inc(count)
        self.delivered_totals[label] = self.delivered_totals.get(label, 0) + count

    def delivered_of(self, topic: str) -> int:
        """Messages of ``topic`` sent by this node since it started (those of topics beyond
        ``max_topic_labels`` counted together)."""
        return self.delivered_totals.get(self.topic(topic), 0)

    def set_topics(self, topics: list[tuple[str, int, int, int]]) -> None:
        """Publish the courier's per-topic figures; topics no longer listed are removed."""
        figures: dict[str, list[int]] = {}
        for topic, ready, unacked, consumers in topics:
            summed = figures.setdefault(self.topic(topic), [0, 0, 0])
            summed[0] += ready
            summed[1] += unacked
            summed[2] += consumers
        for gauge in (self.ready, self.unacked, self.consumers):
            gauge.clear()
        for label, (ready, unacked, consumers) in figures.items():
            self.ready.labels(label).set(ready)
            self.unacked.labels(label).set(unacked)
            self.consumers.labels(label).set(consumers)

    def set_groups(self, groups: list[GroupSummary]) -> None:
        """Publish the groups' replicated figures: ready and unacked per group, drops summed
        per topic label."""
        dropped: dict[str, int] = {}
        figures: dict[tuple[str, str], list[int]] = {}
        for group in groups:
            topic = self.topic(group.topic)
            dropped[topic] = dropped.get(topic, 0) + group.dropped
            name = (OTHER_TOPICS if topic == OTHER_TOPICS
                    else group.name or DEFAULT_GROUP_LABEL)
            summed = figures.setdefault((topic, name), [0, 0])
            summed[0] += group.ready
            summed[1] += group.leased
        for gauge in (self.dropped, self.group_ready, self.group_unacked):
            gauge.clear()
        for topic, count in dropped.items():
            self.dropped.labels(topic).set(count)
        for (topic, name), (ready, unacked) in figures.items():
            self.group_ready.labels(topic, name).set(ready)
            self.group_unacked.labels(topic, name).set(unacked)

    def set_member_lag(self, commit_index: int, match_index: dict[str, int]) -> None:
        """Publish how far behind the leader's commit index each other member is (``{}`` off
        the leader: the gauge is then empty)."""
        self.member_lag.clear()
        for member, held in match_index.items():
            self.member_lag.labels(member).set(max(0, commit_index - held))

    def set_pending(self, pending: dict[str, int], untracked: int) -> None:
        """Publish the replicated pending counts; topics no longer tracked are removed."""
        figures: dict[str, int] = {}
        for topic, count in pending.items():
            label = self.topic(topic)
            figures[label] = figures.get(label, 0) + count
        self.pending.clear()
        for label, count in figures.items():
            self.pending.labels(label).set(count)
        self.pending_untracked.set(untracked)

    def set_storage(self, mended: MendCounts, held: str | None) -> None:
        for kind in ("units", "records", "unmended"):
            self.storage_mended.labels(kind.rstrip("s")).set(getattr(mended, kind))
        self.storage_damage_held.set(held is not None)

    def set_clocks(self, offsets: dict[str, MemberOffset]) -> None:
        """Publish every member's clock offset as the leader estimates it (none elsewhere)."""
        for gauge in (self.clock_offset, self.clock_error):
            gauge.clear()
        for member, offset in offsets.items():
            self.clock_offset.labels(member).set(offset.offset_ms / 1000)
            self.clock_error.labels(member).set(offset.error_ms / 1000)

    def set_disks(self, spaces: list[Space]) -> None:
        """Publish each member's free space and reserve, as this node last heard them."""
        for gauge in (self.disk_free, self.disk_reserve):
            gauge.clear()
        for space in spaces:
            self.disk_free.labels(space.member).set(space.free_bytes)
            self.disk_reserve.labels(space.member).set(space.reserve_bytes)
        self.disk_low.set(any(space.low for space in spaces))

    def serve(self, address: str) -> None:
        """Serve ``/metrics`` on ``host:port`` (a daemon thread)."""
        host, port = address.rsplit(":", 1)
        start_http_server(int(port), addr=host, registry=self.registry)
