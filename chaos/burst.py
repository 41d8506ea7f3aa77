"""A burst in a chaos run (``--burst N``): N messages on a topic of their own, all due at one
instant, scheduled in the middle of the run beside the ordinary workload and its faults.

What it owns: the burst's scheduling and its consumers, both in a process of their own. The
runner's process holds the ordinary consumers, whose receipt times the audit judges the other
topics' lateness by; tens of thousands of receipts a second in that process would make them
late by the runner's own GIL, not by the cluster. The process writes no file: every line it
has for the run's logs (each burst message it scheduled, each receipt) goes to the runner over
a queue, and the runner writes it into the same ``scheduled.jsonl`` and ``received.jsonl`` as
the rest, so the audit owes and judges the burst's messages as any others.

The rule it keeps: a burst message is logged as a producer's is (``acked`` with its handle
once a call answered for it, ``acked`` false when every try failed: its outcome unknown), and
a receipt is stamped on arrival in the process that received it. A batch whose call fails for
want of a leader is sent again, same ids, up to `SCHEDULE_ATTEMPTS` times (the client library
already retries within each call): ids make a repeated schedule harmless.

The runner (`tickwheel.chaos.runner`) starts it before production, so that its consumers
subscribe with the others, fires it ``at_s`` into production, waits for its scheduling to
end with production, and stops it after the drain; ``run.json`` records the burst
(`BurstRecord`), which the audit's burst figures read (`tickwheel.chaos.burst_audit`).
"""

from __future__ import annotations

import logging
import multiprocessing
import queue
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import NamedTuple, TypedDict

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_fixed

from tickwheel.chaos.consumers import Behaviour, ConsumerWorker
from tickwheel.chaos.events import EventLog, ReceivedEvent, ScheduledEvent
from tickwheel.chaos.workload import BODY, Endpoint, now_ms
from tickwheel.client import Client, Message, Scheduled, TickwheelClientError, Unavailable
from tickwheel.client.shards import shard_of

log = logging.getLogger("tickwheel.chaos")

BURST_TOPIC = "burst"
"""The burst's topic: nobody else writes or reads it. Its default group is owed every
message."""
SCHEDULE_RATE = 8_000
"""Messages a second the burst is assumed to be scheduled at on a small machine under the
run's load and faults, for its default lead (`default_lead_s`)."""
MIN_LEAD_S = 5.0
"""The least time from the start of scheduling to the due time, however small the burst."""
SCHEDULE_ATTEMPTS = 3
SHIP_EVERY_S = 0.05
"""How often the burst's process passes its receipts on to the runner."""
CONSUMER = Behaviour("burst", prefetch=1_000)
"""The burst's consumers acknowledge at once, each with up to 1,000 messages on their way:
the burst drains at the cluster's pace, not a consumer's."""


def default_lead_s(messages: int) -> float:
    """From the start of scheduling to the due time: room to schedule ``messages`` first."""
    return MIN_LEAD_S + messages / SCHEDULE_RATE


@dataclass(frozen=True, slots=True)
class BurstConfig:
    messages: int
    at_s: float
    """When scheduling begins, in seconds after production began."""
    lead_s: float
    """From then to the due time of every message of the burst."""
    topic: str = BURST_TOPIC
    consumers: int = 2
    """Streams reading the burst's topic, in its default group."""
    batch: int = 500
    """Messages a ``schedule_many`` call."""
    senders: int = 4
    """Calls in flight at once."""

    def __post_init__(self) -> None:
        if self.messages < 1 or self.at_s < 0 or self.lead_s <= 0:
            raise ValueError("a burst needs messages, a time from 0 on and a lead above 0")


class BurstRecord(TypedDict):
    """``run.json``'s ``burst``: what was asked, and what scheduling it did."""

    topic: str
    group: str
    messages: int
    """Asked for."""
    acked: int
    """Of them, accepted by the cluster (the audit owes these)."""
    at_ms: int
    """When scheduling began."""
    due_ms: int
    """When every message of the burst is due."""
    scheduled_ms: int | None
    """When the last call was answered (None: scheduling did not end)."""


class _Report(NamedTuple):
    """What the burst's process passes to the runner: lines for its logs, and once, when the
    scheduling ended."""

    scheduled: list[ScheduledEvent]
    received: list[ReceivedEvent]
    scheduled_ms: int | None = None


class Burst:
    """The runner's side of a burst: its process, and a thread writing what the process
    reports into the run's logs."""

    def __init__(self, config: BurstConfig, cluster: Endpoint, names: dict[str, str],
                 seed: int, shards: int, scheduled: EventLog[ScheduledEvent],
                 received: EventLog[ReceivedEvent]) -> None:
        context = multiprocessing.get_context("spawn")
        self._config = config
        self._fire: Queue[tuple[int, int]] = context.Queue()
        self._reports: Queue[_Report | None] = context.Queue()
        self._stop = context.Event()
        self._process = context.Process(
            target=_serve, name="chaos-burst", daemon=True,
            args=(config, cluster, names, seed, shards, self._fire, self._reports, self._stop))
        self._logs = scheduled, received
        self._relay = threading.Thread(target=self._write, name="burst-relay", daemon=True)
        self._scheduled = threading.Event()
        self.record: BurstRecord | None = None

    def start(self) -> None:
        self._process.start()
        self._relay.start()

    def fire(self, at_ms: int) -> None:
        """Schedule the burst from ``at_ms`` on, due `BurstConfig.lead_s` later."""
        due_ms = at_ms + round(self._config.lead_s * 1000)
        self.record = BurstRecord(topic=self._config.topic, group="",
                                  messages=self._config.messages, acked=0, at_ms=at_ms,
                                  due_ms=due_ms, scheduled_ms=None)
        self._fire.put((at_ms, due_ms))

    def wait_scheduled(self, timeout_s: float) -> bool:
        """Whether the burst's scheduling ended (every message logged) within ``timeout_s``."""
        return self._scheduled.wait(timeout_s)

    def stop(self, timeout_s: float = 60.0) -> None:
        """Close the burst's consumers and wait for their last receipts to be logged."""
        self._stop.set()
        self._process.join(timeout_s)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(timeout_s)
        self._reports.put(None)  # ends the relay if the process could not say so itself
        self._relay.join(timeout_s)
        if self._process.exitcode != 0:
            raise RuntimeError(f"the burst's process exited with {self._process.exitcode}")

    def _write(self) -> None:
        scheduled, received = self._logs
        while (report := self._reports.get()) is not None:
            if report.scheduled:
                scheduled.write_many(report.scheduled)
                if self.record is not None:
                    self.record["acked"] += sum(event["acked"] for event in report.scheduled)
            if report.received:
                received.write_many(report.received)
            if report.scheduled_ms is not None and self.record is not None:
                self.record["scheduled_ms"] = report.scheduled_ms
                self._scheduled.set()


class _Shipper(threading.Thread):
    """The burst consumers' `EventWriter`: passes their receipts on in batches, every
    `SHIP_EVERY_S` and once more when finished."""

    def __init__(self, reports: Queue[_Report | None]) -> None:
        super().__init__(name="burst-shipper", daemon=True)
        self._reports = reports
        self._pending: list[ReceivedEvent] = []
        self._lock = threading.Lock()
        self._done = threading.Event()

    def write(self, event: ReceivedEvent) -> None:
        with self._lock:
            self._pending.append(event)

    def run(self) -> None:
        while not self._done.wait(SHIP_EVERY_S):
            self._ship()
        self._ship()

    def finish(self) -> None:
        self._done.set()
        self.join()

    def _ship(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        if batch:
            self._reports.put(_Report(scheduled=[], received=batch))


def _serve(config: BurstConfig, cluster: Endpoint, names: dict[str, str], seed: int,
           shards: int, fire: Queue[tuple[int, int]], reports: Queue[_Report | None],
           stop: Event) -> None:
    """The burst's process: its consumers from the start, its scheduling once fired, until
    ``stop``."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("tickwheel.client").setLevel(logging.WARNING)
    halt = threading.Event()
    shipper = _Shipper(reports)
    consumers = [ConsumerWorker(cluster, config.topic, "", CONSUMER, seed + i, names,
                                shipper, halt) for i in range(config.consumers)]
    for thread in (shipper, *consumers):
        thread.start()
    fired = _fired(fire, stop)
    if fired is not None:
        _schedule(config, cluster, shards, *fired, reports, stop)
    stop.wait()
    halt.set()
    for consumer in consumers:
        consumer.close()
    for consumer in consumers:
        consumer.join(30)
    shipper.finish()
    reports.put(None)


def _fired(fire: Queue[tuple[int, int]], stop: Event) -> tuple[int, int] | None:
    """``(at_ms, due_ms)`` once the runner fires the burst; None if it stops first."""
    while not stop.is_set():
        try:
            return fire.get(timeout=0.2)
        except queue.Empty:
            continue
    return None


def _schedule(config: BurstConfig, cluster: Endpoint, shards: int, at_ms: int, due_ms: int,
              reports: Queue[_Report | None], stop: Event) -> None:
    """From ``at_ms``, every message of the burst, due at ``due_ms``, in batches with
    `BurstConfig.senders` calls in flight; each batch's lines reported once answered. Batches
    not begun when ``stop`` is set are never sent (nor logged)."""
    stop.wait(max(0.0, (at_ms - now_ms()) / 1000))
    batches = [[Message(config.topic, BODY, deliver_at_ms=due_ms, id=f"{config.topic}-{k}")
                for k in range(first, min(first + config.batch, config.messages))]
               for first in range(0, config.messages, config.batch)]
    with cluster.client(timeout_s=15, attempt_timeout_s=3) as client:
        def send(batch: list[Message]) -> None:
            if not stop.is_set():
                reports.put(_Report(scheduled=_send(client, batch, due_ms, shards),
                                    received=[]))
        with ThreadPoolExecutor(config.senders, thread_name_prefix="burst-sender") as pool:
            list(pool.map(send, batches))
    reports.put(_Report(scheduled=[], received=[], scheduled_ms=now_ms()))
    log.info("event=burst_scheduled messages=%d took_ms=%d due_in_ms=%d", config.messages,
             now_ms() - at_ms, due_ms - now_ms())


def _send(client: Client, batch: list[Message], due_ms: int,
          shards: int) -> list[ScheduledEvent]:
    """One batch scheduled, tried again while no leader answers; its lines."""
    sent_ms = now_ms()
    retrying = Retrying(stop=stop_after_attempt(SCHEDULE_ATTEMPTS), wait=wait_fixed(1),
                        retry=retry_if_exception_type(Unavailable), reraise=True)
    results: list[Scheduled] | None
    try:
        results = retrying(client.schedule_many, batch)
    except TickwheelClientError as error:
        log.warning("event=burst_schedule_failed messages=%d error=%s", len(batch), error)
        results = None
    acked_ms = None if results is None else now_ms()
    return [{"id": message.id, "topic": message.topic, "deliver_at_ms": due_ms,
             "sent_ms": sent_ms, "acked": results is not None, "acked_ms": acked_ms,
             "handle": None if results is None else results[position].handle,
             "kind": "burst", "shard": shard_of(message.id, shards)}
            for position, message in enumerate(batch)]
