"""One chaos run: a real cluster, a workload, faults, and the logs the audit reads.

`run` starts ``nodes`` ``tickwheel serve`` processes (for each of ``shards`` shards) behind Raft
proxies, subscribes consumers,
then produces for ``duration_s`` while the `Nemesis` inflicts faults, and, with a ``burst``,
schedules it in the middle (`tickwheel.chaos.burst`). When production stops it
lets delivery drain (until every accepted, uncancelled message due by then has arrived, or
``drain_max_s``), fetches the nodes' ledgers into ``OUT/ledgers`` with ``tickwheel ledger
fetch`` while they still run (`ChaosCluster.fetch_ledgers`), stops everything it started, and
writes ``OUT/run.json`` beside the event logs. Verdicts are the audit's job (``python -m
tickwheel.chaos.audit OUT``).
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol, TypedDict

from rich.console import Console
from rich.progress import Progress

from tickwheel.chaos.burst import Burst, BurstConfig, BurstRecord
from tickwheel.chaos.cluster import ChaosCluster
from tickwheel.chaos.consumers import SUBSCRIPTIONS, ConsumerWorker
from tickwheel.chaos.events import (
    CancelEvent,
    Event,
    EventLog,
    FaultEvent,
    LeaderEvent,
    ReceivedEvent,
    RescheduleEvent,
    ScheduledEvent,
)
from tickwheel.chaos.nemesis import Nemesis, NemesisConfig
from tickwheel.chaos.races import Canceller, Race, Racer
from tickwheel.chaos.workload import (
    GROUPS,
    IDLE_TOPIC,
    Accepted,
    Endpoint,
    LeaderMonitor,
    Mix,
    Producer,
    now_ms,
)
from tickwheel.harness.processes import wait_for

log = logging.getLogger("tickwheel.chaos")

DISK_SIZE = "1g"
"""Each node's tmpfs with the ``disk-full`` fault: room for a long run's data and its reserve
(memory is used only as it is written)."""
ALLOWED_EARLY_MS = 2
"""How early a receipt may be, by the harness's clock, before the audit counts it early: in
every run, skew and clock steps included (a node hands a message out only once the time a
majority of clocks reached has passed its due time, and the faults keep one clock off at a
time: docs/replication.md). Not 0 for the harness's own clock reads alone: it and the nodes
read the same clock in whole milliseconds, and the leader extrapolates each follower's clock
on its monotonic clock from the latest answer, while NTP may slew the real clock against the
monotonic one by up to 500 ppm (0.25 ms over the 0.5 s an answer is used): 1 ms for that
slew and 1 for a floor to the millisecond on either side."""
BURST_SCHEDULING_MAX_S = 120
"""How long production's end waits for a burst's scheduling to end (it is meant to end before
the burst is due, well within the run)."""
CHAOS_LEDGER_MAX_BYTES = 2 << 30
"""The nodes' ``ledger_max_bytes``: the audit reads every send of a run, so no segment may be
deleted within one (a 10-minute run writes a few tens of MiB on the busiest node)."""
CHAOS_LEDGER_SEGMENT_AGE_MS = 500
"""The nodes' ``ledger_segment_age_ms``: a leader killed loses at most its last half second
of sends from the audit's evidence (its open segment), and a 10-minute run leaves ~1,200
segments a node for Spark to read."""


@dataclass(frozen=True)
class RunConfig:
    out: Path
    nodes: int = 3
    """Per shard."""
    shards: int = 1
    duration_s: float = 120.0
    rate: float = 200.0
    """Messages scheduled per second, all producers together."""
    seed: int = 1
    producers: int = 2
    cancel_fraction: float = 0.03
    race_fraction: float = 0.03
    """Of the consumed topics' messages, the share cancelled or rescheduled just before due."""
    race: Race = field(default_factory=Race)
    grace_ms: int = 5_000
    """The audit counts a message lost only if it was due this long before the run ended."""
    drain_max_s: float = 60.0
    keep_data: bool = False
    """Keep the nodes' data folders (``OUT/cluster``) after the run."""
    snapshot_min_entries: int | None = None
    """The nodes' ``--snapshot-min-entries``; None: their default."""
    mix: Mix = field(default_factory=Mix)
    nemesis: NemesisConfig = field(default_factory=NemesisConfig)
    burst: BurstConfig | None = None
    """A burst on a topic of its own, in the middle of the run; None: none."""

    @property
    def groups(self) -> dict[str, tuple[str, ...]]:
        """The consumed topics and their groups: the workload's, and the burst's default
        group."""
        return GROUPS | ({} if self.burst is None else {self.burst.topic: ("",)})


class _Expected:
    """Which accepted messages are still owed a delivery to which group; read to know when to
    stop draining. Fed by wrapping the event logs' writers."""

    def __init__(self, groups: dict[str, tuple[str, ...]]) -> None:
        self._topic_groups = groups
        self._lock = threading.Lock()
        self._due: dict[tuple[str, str], int] = {}
        self._groups: dict[str, tuple[str, ...]] = {}
        self._cancelled: set[str] = set()
        self._received: set[tuple[str, str]] = set()

    def scheduled(self, event: ScheduledEvent) -> None:
        if event["acked"]:
            with self._lock:
                self._groups[event["id"]] = groups = self._topic_groups.get(event["topic"], ())
                for group in groups:
                    self._due[(event["id"], group)] = event["deliver_at_ms"]

    def cancelled(self, event: CancelEvent) -> None:
        """Cancelled, maybe cancelled, or (``handed_out``) cancelled for the groups that had
        not had it: owed to no group that has not received it yet."""
        if event["outcome"] != "not_pending":
            with self._lock:
                self._cancelled.add(event["id"])

    def rescheduled(self, event: RescheduleEvent) -> None:
        """A moved message is owed at its new time; one whose move may or may not have
        happened, at the later of the two."""
        if event["outcome"] in ("rescheduled", "unknown"):
            moved_ms = event["deliver_at_ms"]
            with self._lock:
                for group in self._groups.get(event["id"], ()):
                    key = (event["id"], group)
                    self._due[key] = (moved_ms if event["outcome"] == "rescheduled"
                                      else max(self._due[key], moved_ms))

    def received(self, event: ReceivedEvent) -> None:
        with self._lock:
            self._received.add((event["id"], event.get("group") or ""))

    def missing(self, due_by_ms: int) -> int:
        with self._lock:
            return sum(1 for key, due_ms in self._due.items()
                       if due_ms <= due_by_ms and key not in self._received
                       and key[0] not in self._cancelled)


class _TappedLog(EventLog[Event]):
    """An `EventLog` that also shows each event to ``tap``."""

    def __init__(self, path: Path, tap: Callable[[Event], None]) -> None:
        super().__init__(path)
        self._tap = tap

    def write(self, event: Event) -> None:
        super().write(event)
        self._tap(event)

    def write_many(self, events: list[Event]) -> None:
        super().write_many(events)
        for event in events:
            self._tap(event)


class _File(Protocol):
    """What the runner asks of every event log, whatever its events."""

    lines: int

    def close(self) -> None: ...


@dataclass(frozen=True)
class _Logs:
    """The run's event logs (the files named after the fields)."""

    scheduled: EventLog[ScheduledEvent]
    cancels: EventLog[CancelEvent]
    reschedules: EventLog[RescheduleEvent]
    received: EventLog[ReceivedEvent]
    leaders: EventLog[LeaderEvent]
    faults: EventLog[FaultEvent]

    @classmethod
    def open(cls, out: Path, expected: _Expected) -> _Logs:
        return cls(scheduled=_TappedLog(out / "scheduled.jsonl", expected.scheduled),
                   cancels=_TappedLog(out / "cancels.jsonl", expected.cancelled),
                   reschedules=_TappedLog(out / "reschedules.jsonl", expected.rescheduled),
                   received=_TappedLog(out / "received.jsonl", expected.received),
                   leaders=EventLog(out / "leaders.jsonl"),
                   faults=EventLog(out / "faults.jsonl"))

    def files(self) -> dict[str, _File]:
        return {"scheduled": self.scheduled, "cancels": self.cancels,
                "reschedules": self.reschedules, "received": self.received,
                "leaders": self.leaders, "faults": self.faults}


class Summary(TypedDict):
    """What a run did: ``run.json``'s ``summary``."""

    inflicted: list[str]
    max_skew_ms: int
    leader_changes: int
    consumer_crashes: int
    lines: dict[str, int]


class NodeRecord(TypedDict):
    name: str
    raft: str
    grpc: str
    shard: int
    ledgers: list[str]
    """Its folders under ``OUT/ledgers``: each wiped generation's, then the fetched one."""


class RunRecord(TypedDict):
    """What ``run.json`` holds (the audit's docstring says what each field means)."""

    started_ms: int
    ended_ms: int
    drained_due_ms: int
    seed: int
    shards: int
    nodes: list[NodeRecord]
    faults: list[str]
    grace_ms: int
    max_skew_ms: int
    groups: dict[str, tuple[str, ...]]
    idle_topics: list[str]
    allowed_early_ms: int
    burst: BurstRecord | None
    ledger_fetch: int
    """The exit status of ``tickwheel ledger fetch`` (0: every node's ledger fetched)."""
    config: dict[str, object]
    summary: Summary


def run(config: RunConfig, console: Console | None = None) -> RunRecord:
    """Run one scenario; returns what ``run.json`` holds."""
    console = console or Console(stderr=True)
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    expected = _Expected(config.groups)
    logs = _Logs.open(out, expected)
    started_ms = now_ms()
    try:
        disk_size = DISK_SIZE if "disk-full" in config.nemesis.faults else None
        node_args = ("--ledger-max-bytes", str(CHAOS_LEDGER_MAX_BYTES),
                     "--ledger-segment-age-ms", str(CHAOS_LEDGER_SEGMENT_AGE_MS)) + (
            () if config.snapshot_min_entries is None
            else ("--snapshot-min-entries", str(config.snapshot_min_entries)))
        with ChaosCluster(out / "cluster", config.nodes, out / "ledgers", node_args,
                          disk_size=disk_size, power_cuts="power-cut" in config.nemesis.faults,
                          shards=config.shards) as cluster:
            ended_ms, drained_due_ms, summary, burst = _scenario(config, cluster, logs,
                                                                 expected, console)
            ledger_fetch = cluster.fetch_ledgers()
            if ledger_fetch != 0:
                log.warning("event=ledger_fetch_incomplete status=%d (OUT/ledgers/fetch.json "
                            "names the nodes missed)", ledger_fetch)
            nodes = [NodeRecord(name=cluster.name(n), raft=n.raft, grpc=n.grpc_address,
                                shard=n.shard, ledgers=cluster.ledger_folders(n))
                     for n in cluster.nodes]
    finally:
        for event_log in logs.files().values():
            event_log.close()
    if not config.keep_data:
        shutil.rmtree(out / "cluster", ignore_errors=True)
    record = RunRecord(
        started_ms=started_ms, ended_ms=ended_ms, drained_due_ms=drained_due_ms,
        seed=config.seed, shards=config.shards, nodes=nodes,
        faults=list(config.nemesis.faults),
        grace_ms=config.grace_ms, max_skew_ms=summary["max_skew_ms"],
        groups=config.groups, idle_topics=[IDLE_TOPIC], allowed_early_ms=ALLOWED_EARLY_MS,
        burst=burst, ledger_fetch=ledger_fetch,
        config={key: value for key, value in asdict(config).items() if key != "out"}
        | {"out": str(out)}, summary=summary)
    (out / "run.json").write_text(json.dumps(record, indent=2, default=str))
    return record


def _scenario(config: RunConfig, cluster: ChaosCluster, logs: _Logs, expected: _Expected,
              console: Console) -> tuple[int, int, Summary, BurstRecord | None]:
    """``(ended_ms, drained_due_ms, summary, burst)``: when the run ended, the due time it
    drained to, what it did, and the burst's record."""
    targets = Endpoint([node.grpc_address for node in cluster.nodes], cluster.credentials())
    cluster.leaders(30)
    stop_all = threading.Event()
    monitors = [LeaderMonitor({cluster.name(n): n.grpc_address for n in members},
                              targets.credentials, logs.leaders, stop_all, shard=shard)
                for shard, members in enumerate(cluster.shards)]
    consumers = [ConsumerWorker(targets, topic, group, behaviour, config.seed * 1_000 + i,
                                cluster.names, logs.received, stop_all)
                 for i, (topic, group, behaviour) in enumerate(SUBSCRIPTIONS)]
    burst = None if config.burst is None else Burst(
        config.burst, targets, cluster.names, config.seed * 1_000 + 900, config.shards,
        logs.scheduled, logs.received)
    for thread in (*monitors, *consumers):
        thread.start()
    try:
        if burst is not None:
            burst.start()
        streams = sum(not behaviour.unary for _, _, behaviour in SUBSCRIPTIONS) + (
            0 if config.burst is None else config.burst.consumers)
        wait_for(lambda: _subscribed(cluster) >= streams, 30, "every consumer to subscribe")
        produced_ms, nemesis = _produce(config, cluster, targets, logs, monitors, burst,
                                        console)
        try:
            wait_for(lambda: expected.missing(produced_ms) == 0, config.drain_max_s,
                     "every accepted message due by the end of production", poll_s=0.2)
        except TimeoutError:
            log.warning("event=drain_incomplete missing=%d", expected.missing(produced_ms))
    finally:
        stop_all.set()
        for consumer in consumers:
            consumer.close()
        if burst is not None:
            burst.stop()
    for thread in (*monitors, *consumers):
        thread.join(30)
    return now_ms(), produced_ms, Summary(
        inflicted=nemesis.inflicted, max_skew_ms=nemesis.max_skew_ms,
        leader_changes=sum(monitor.changes for monitor in monitors),
        consumer_crashes=sum(c.crashes for c in consumers),
        lines={name: event_log.lines for name, event_log in logs.files().items()}), (
        None if burst is None else burst.record)


def _produce(config: RunConfig, cluster: ChaosCluster, targets: Endpoint, logs: _Logs,
             monitors: list[LeaderMonitor], burst: Burst | None,
             console: Console) -> tuple[int, Nemesis]:
    """Produce and inflict faults for ``duration_s``, the burst fired in the middle; returns
    when production ended (the burst's scheduling with it) and the nemesis."""
    stop_producing = threading.Event()
    accepted: deque[Accepted] = deque()
    producers = [Producer(i, targets, config.rate / config.producers, config.mix,
                          config.seed * 100 + i, logs.scheduled, accepted, stop_producing,
                          shards=config.shards)
                 for i in range(config.producers)]
    racer = Racer(targets, config.seed * 10 + 8, logs.cancels, logs.reschedules,
                  stop_producing, config.race)
    canceller = Canceller(targets, config.cancel_fraction, config.seed * 10 + 7,
                          logs.cancels, accepted, stop_producing, racer, config.race_fraction)
    nemesis = Nemesis(cluster, config.nemesis, config.seed, logs.faults, stop_producing)
    production = [*producers, canceller, racer, nemesis]
    for thread in production:
        thread.start()
    if burst is not None and config.burst is not None:
        burst.fire(now_ms() + round(config.burst.at_s * 1000))
    _watch(config, logs, monitors, console)
    stop_producing.set()
    for thread in production:
        thread.join(120)
    if nemesis.error is not None:
        raise RuntimeError("the nemesis failed") from nemesis.error
    if burst is not None and not burst.wait_scheduled(BURST_SCHEDULING_MAX_S):
        log.warning("event=burst_unscheduled waited_s=%d", BURST_SCHEDULING_MAX_S)
    return now_ms(), nemesis


def _subscribed(cluster: ChaosCluster) -> int:
    """The consumer streams the leader of every shard counts, at the least (each consumer
    holds one to each shard)."""
    infos = [leader.info() for leader in cluster.leaders(10)]
    return min(0 if info is None else sum(topic.consumers for topic in info.topics)
               for info in infos)


def _watch(config: RunConfig, logs: _Logs, monitors: list[LeaderMonitor],
           console: Console) -> None:
    """Show progress until the production time is up."""
    began = time.monotonic()
    with Progress(console=console, transient=False) as progress:
        task = progress.add_task("chaos", total=config.duration_s)
        while (elapsed := time.monotonic() - began) < config.duration_s:
            progress.update(task, completed=elapsed, description=(
                f"scheduled {logs.scheduled.lines} received {logs.received.lines} "
                f"faults {logs.faults.lines} "
                f"leader {' '.join(str(monitor.current[0]) for monitor in monitors)}"))
            time.sleep(min(0.5, config.duration_s - elapsed))
        progress.update(task, completed=config.duration_s)
