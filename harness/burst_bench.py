"""``python -m tickwheel.harness.burst_bench --json``: a million messages due in the same
millisecond, on a 3-node cluster of real processes (TLS, tokens, the Raft secret).

Producer processes schedule ``--messages`` messages (100-byte bodies) at ``--schedule-rate``,
all due at one time T, chosen far enough ahead for the scheduling to finish before it;
``--consumers`` consumer processes receive and acknowledge them. Beside the burst, a steady
topic gets ``--steady-rate`` messages a second, each due a second after it is sent, read by a
consumer of its own (or ``--steady-topics`` topics share that rate, a consumer each): how the
burst delays everybody else. Figures:

- ``burst_delivered``, ``burst_repeated`` (receipts of an id already received),
  ``burst_retried`` (of those, retries: ``attempt`` above 1, their visibility timeout ran
  out before their ack was applied), ``burst_unflagged_repeats`` (of those, neither a retry
  nor flagged ``possible_duplicate``: a broken promise),
  ``burst_flagged``, ``burst_early`` (received more than ``ALLOWED_EARLY_MS`` before T by the
  consumers' clock, which is the machine's);
- ``burst_last_after_due_s``: the last first receipt after T; ``burst_delivered_per_s`` over
  that time;
- ``burst_scheduled_s`` (how long scheduling took) and ``burst_scheduled_late_s`` (how far past
  T it finished: 0 when T was far enough ahead);
- ``leader_peak_rss_mb``: the leader's peak resident memory (``VmHWM``) over the run,
  ``leader_rss_at_due_mb`` its resident memory at T (what the scheduling left: the Raft log
  since the last snapshot, the dedupe window), ``leader_rss_anon_at_due_mb`` and
  ``leader_peak_rss_anon_mb`` / ``leader_peak_rss_file_mb`` (sampled every half second from
  T) the parts of it that are the process's own memory and pages of the files it maps (the
  wheel's log, read as messages go out: page cache, which the kernel takes back when it needs
  it), and ``leader_cpu_s`` from T to the last receipt;
- ``steady_lateness_p50_ms`` / ``_p99_ms`` / ``_max_ms``: the steady topic's messages due
  between T and the burst's last receipt;
- ``burst_peak_ready`` / ``burst_peak_leased``: the most messages the burst's group held ready
  (readied, waiting for a lease) and leased, as the cluster answered every half second from T,
  and ``burst_dropped``: how many it dropped (past ``max_ready_msgs``).

``--no-ledger`` runs the nodes without their ledger, and ``--ledger-segment-age-ms`` gives
them another segment age than `LocalCluster`'s 250 ms (0: the node's default): what the
ledger costs the burst, run alternately with and without it.

It does not run in ``make test`` at its size; a test runs it with a few thousand messages.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing
import multiprocessing.sharedctypes
import re
import sys
import tempfile
import threading
import time
import urllib.request
from array import array
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.queues import Queue
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path

from tickwheel.client import Client, Message
from tickwheel.harness.bench_clients import (
    BODY,
    Endpoint,
    client_of,
    consumer_until,
    endpoint_of,
    now_ms,
    subscribed,
)
from tickwheel.harness.bench_figures import cpu_s, percentiles
from tickwheel.harness.local_cluster import LEDGER_SEGMENT_AGE_MS, LocalCluster
from tickwheel.harness.processes import wait_for

ALLOWED_EARLY_MS = 2
"""As the chaos audit: the consumers and the nodes read the same clock in whole ms."""
SCHEDULE_RATE = 10_000
"""Messages a second the burst is scheduled at by default: a burst due at once is scheduled
over time (orders with one timeout, a campaign's reminders), not in the same seconds; at full
speed the producers beside the nodes on a small machine measure scheduling, not the burst."""
BATCH = 500


def _produce(endpoint: Endpoint, first: int, count: int, threads: int, rate: float,
             due_ms: int, start: Event) -> None:
    """Schedule ids ``burst-<first>`` .. ``burst-<first + count - 1>``, all due at ``due_ms``,
    at ``rate`` messages a second."""
    batches = [[Message("burst", BODY, deliver_at_ms=due_ms, id=f"burst-{k}")
                for k in range(at, min(at + BATCH, first + count))]
               for at in range(first, first + count, BATCH)]
    with client_of(endpoint, 120) as client:
        client.cluster_info()
        start.wait()
        began = time.monotonic()

        def send(numbered: tuple[int, list[Message]]) -> None:
            time.sleep(max(0.0, began + numbered[0] * BATCH / rate - time.monotonic()))
            client.schedule_many(numbered[1])
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(send, enumerate(batches)))


POSSIBLE_DUPLICATE, RETRY = 1, 2
"""A receipt's flags: ``possible_duplicate``, and ``attempt > 1`` (a retry: its lease ran out,
here its visibility timeout, so it comes back as the retry ladder says)."""
Receipts = tuple[bytes, bytes, bytes]
"""A consumer's receipts: id numbers (or due times), arrival times and flags, packed."""


def _consume(endpoint: Endpoint, topics: list[str], received: Synchronized[int],
             seen: ctypes.Array[ctypes.c_bool] | None, stop: Event,
             results: Queue[Receipts]) -> None:
    """Receive and ack ``topics`` (a consumer of each, on a thread of its own); report each
    receipt's id number (or due time, for the steady topics), arrival time and flags
    (`POSSIBLE_DUPLICATE`, `RETRY`). ``received`` counts the ids received for the first time
    by any consumer (``seen``, shared), or every receipt."""
    numbers, arrivals, flags = array("q"), array("d"), array("b")
    noted = threading.Lock()

    def read(client: Client, topic: str) -> None:
        for message in consumer_until(client, topic, f"burst-{topic}", stop):
            arrived_ms = time.time_ns() / 1e6
            number = (int(message.id.rsplit("-", 1)[1]) if seen is not None
                      else message.deliver_at_ms)
            with noted:
                arrivals.append(arrived_ms)
                numbers.append(number)
                flags.append(POSSIBLE_DUPLICATE * message.possible_duplicate
                             + RETRY * (message.attempt > 1))
            message.ack()
            with received.get_lock():
                if seen is None or not seen[number]:
                    received.value += 1
                if seen is not None:
                    seen[number] = True
    with client_of(endpoint, 120) as client:
        readers = [threading.Thread(target=read, args=(client, topic)) for topic in topics]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join()
    results.put((numbers.tobytes(), arrivals.tobytes(), flags.tobytes()))


def _unpack(raw: Receipts) -> tuple[array[int], array[float], array[int]]:
    numbers, arrivals, flags = array("q"), array("d"), array("b")
    numbers.frombytes(raw[0])
    arrivals.frombytes(raw[1])
    flags.frombytes(raw[2])
    return numbers, arrivals, flags


def _rss_mb(pid: int, field: str = "VmHWM") -> float:
    """The process's peak (``VmHWM``) or current (``VmRSS``) resident memory, or the part of
    the current one that is its own (``RssAnon``) or pages of files it maps (``RssFile``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no {field} for {pid}")


def burst(cluster: LocalCluster, messages: int, producers: int, threads: int, consumers: int,
          steady_rate: int, schedule_rate: int, steady_topics: int = 1) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    endpoint = endpoint_of(cluster)
    received: Synchronized[int] = context.Value(ctypes.c_longlong, 0)
    steady_received: Synchronized[int] = context.Value(ctypes.c_longlong, 0)
    stop = context.Event()
    results: Queue[Receipts] = context.Queue()
    steady_results: Queue[Receipts] = context.Queue()
    seen = multiprocessing.sharedctypes.RawArray(ctypes.c_bool, messages)
    readers = [context.Process(target=_consume, args=(endpoint, ["burst"], received, seen,
                                                      stop, results)) for _ in range(consumers)]
    steadies = (["steady"] if steady_topics == 1
                else [f"steady-{k}" for k in range(steady_topics)])
    steady_reader = context.Process(target=_consume, args=(endpoint, steadies, steady_received,
                                                           None, stop, steady_results))
    for process in [*readers, steady_reader]:
        process.start()
    wait_for(lambda: subscribed(cluster, "burst") == consumers
             and _topics_read(cluster, steadies) == len(steadies), 60,
             "the consumers to subscribe")
    start = context.Event()
    due_ms = now_ms() + int((5 + 1.2 * messages / schedule_rate) * 1000)
    share = -(-messages // producers)
    writers = [context.Process(target=_produce, args=(
        endpoint, p * share, min(share, messages - p * share), threads,
        schedule_rate / producers, due_ms, start))
        for p in range(producers)]
    for process in writers:
        process.start()
    time.sleep(3)  # the producers build their batches and connect; the clock starts below
    steady_done = threading.Event()
    steady_calls: list[tuple[float, float]] = []
    steady = threading.Thread(target=_steady, args=(endpoint, steady_rate, steady_done,
                                                    steady_calls, steadies))
    steady.start()
    began = time.monotonic()
    start.set()
    for process in writers:
        process.join()
        if process.exitcode != 0:
            raise RuntimeError(f"a producer exited with {process.exitcode}")
    scheduled_s, scheduled_ms = time.monotonic() - began, now_ms()
    leader = cluster.leader()
    wait_for(lambda: now_ms() >= due_ms, max(0.0, (due_ms - now_ms()) / 1000) + 5, "T")
    leader_cpu_s = cpu_s(leader.pid)
    rss_at_due_mb = _rss_mb(leader.pid, "VmRSS")
    anon_at_due_mb = _rss_mb(leader.pid, "RssAnon")
    watched: dict[str, float] = {}
    urls = [f"http://{node.metrics_address}/metrics" for node in cluster.nodes]
    watcher = threading.Thread(target=_watch_group, args=(endpoint, "burst", steady_done,
                                                          watched, leader.pid, urls))
    watcher.start()
    wait_for(lambda: received.value >= messages, 600, f"{messages} burst messages to arrive",
             poll_s=0.1)
    leader_cpu_s = cpu_s(leader.pid) - leader_cpu_s
    steady_done.set()
    steady.join()
    watcher.join()
    peak_rss_mb = _rss_mb(leader.pid)
    stop.set()
    tally = _tally([results.get(timeout=60) for _ in readers], due_ms)
    last_ms = tally.pop("last_ms")
    steady_figures = _steady_figures(steady_results.get(timeout=60), steady_calls, due_ms,
                                     last_ms)
    for process in [*readers, steady_reader]:
        process.join(10)
    last_after_s = (last_ms - due_ms) / 1000
    return {"burst_messages": messages, **tally,
            "burst_last_after_due_s": round(last_after_s, 2),
            "burst_delivered_per_s": round(tally["burst_delivered"] / max(last_after_s, 1e-3)),
            "burst_scheduled_s": round(scheduled_s, 1),
            "burst_scheduled_late_s": round(max(0, scheduled_ms - due_ms) / 1000, 2),
            "leader_rss_at_due_mb": rss_at_due_mb, "leader_peak_rss_mb": peak_rss_mb,
            "leader_rss_anon_at_due_mb": anon_at_due_mb,
            "leader_cpu_s": round(leader_cpu_s, 1),
            **steady_figures, **watched}


def _tally(receipts: list[Receipts], due_ms: int) -> dict[str, float]:
    """What the burst's consumers received: first receipts, repeats (flagged, retries, or
    neither: a broken promise), early ones, and the last first receipt's time (``last_ms``)."""
    seen: set[int] = set()
    repeated = retried = unflagged = flagged = early = 0
    last_ms = 0.0
    # in the order they arrived, whichever consumer: a repeat is a receipt after the first
    for arrived_ms, number, flag in sorted(
            (arrived_ms, number, flag) for raw in receipts
            for number, arrived_ms, flag in zip(*_unpack(raw), strict=True)):
        flagged += bool(flag & POSSIBLE_DUPLICATE)
        early += arrived_ms < due_ms - ALLOWED_EARLY_MS
        if number in seen:
            repeated += 1
            retried += bool(flag & RETRY)
            unflagged += not flag
        else:
            seen.add(number)
            last_ms = max(last_ms, arrived_ms)
    return {"burst_delivered": len(seen), "burst_repeated": repeated,
            "burst_retried": retried, "burst_unflagged_repeats": unflagged,
            "burst_flagged": flagged, "burst_early": early, "last_ms": last_ms}


def _topics_read(cluster: LocalCluster, topics: list[str]) -> int:
    """How many of ``topics`` the leader counts a consumer of (0 while it does not answer)."""
    info = cluster.leader().info()
    wanted = set(topics)
    return 0 if info is None else sum(1 for t in info.topics
                                      if t.topic in wanted and t.consumers)


def _steady(endpoint: Endpoint, rate: int, done: threading.Event,
            calls: list[tuple[float, float]], topics: list[str]) -> None:
    """``rate`` messages a second on the steady topics (in turn), each due a second after it
    is sent; each call's start (ms) and how long it took (ms) into ``calls``."""
    with client_of(endpoint, 60) as client:
        sent = 0
        began = time.monotonic()
        while not done.is_set():
            due_now = int((time.monotonic() - began) * rate) + 1
            if due_now > sent:
                called_ms, called_s = now_ms(), time.monotonic()
                client.schedule_many(Message(topics[k % len(topics)], BODY,
                                             deliver_at_ms=called_ms + 1_000,
                                             id=f"steady-{k}") for k in range(sent, due_now))
                calls.append((called_ms, (time.monotonic() - called_s) * 1000))
                sent = due_now
            done.wait(0.01)


SCRAPE_S = 2.0
"""How often the bench reads the nodes' ``/metrics`` during the burst: a scrape of a node
serving 200 topics costs it ~50 ms of CPU, and read every half second (twice, once a metric)
it took a fifth of a core from each node under test. The longest step is kept for 5-10 s, so
a scrape every 2 s misses none."""


def _scrape(urls: list[str], names: tuple[str, ...]) -> list[tuple[float, ...]]:
    """Each node's values of the metrics ``names`` (ones without labels), one scrape each."""
    values = []
    for url in urls:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        found = [re.search(rf"^{name} (\S+)$", text, re.MULTILINE) for name in names]
        if None in found:
            raise RuntimeError(f"{url} lacks one of {names}")
        values.append(tuple(float(match.group(1)) for match in found if match is not None))
    return values


def _watch_group(endpoint: Endpoint, topic: str, done: threading.Event,
                 figures: dict[str, float], leader_pid: int, urls: list[str]) -> None:
    """Every half second until ``done``: the most ``topic``'s default group held ready and
    leased, how many it dropped, the leader's largest resident memory of its own and of
    mapped files; every `SCRAPE_S` and at the end, the longest Raft-thread step of any node
    (each node's longest within the last 5-10 s) and how many elections the nodes' terms
    counted, into ``figures``."""
    figures.update(burst_peak_ready=0, burst_peak_leased=0, burst_dropped=0,
                   leader_peak_rss_anon_mb=0.0, leader_peak_rss_file_mb=0.0,
                   raft_step_max_ms=0.0)
    names = ("tickwheel_raft_term", "tickwheel_raft_step_longest_seconds")
    first_term = max(term for term, _ in _scrape(urls, names))
    scraped_at = time.monotonic()
    with client_of(endpoint, 60) as client:
        while not done.is_set():
            done.wait(0.5)
            if time.monotonic() - scraped_at >= SCRAPE_S or done.is_set():
                scraped_at = time.monotonic()
                scraped = _scrape(urls, names)
                figures["raft_step_max_ms"] = max(figures["raft_step_max_ms"], 1000 * max(
                    longest for _, longest in scraped))
                figures["elections_during_burst"] = max(term for term, _ in scraped
                                                        ) - first_term
            for kind in ("anon", "file"):
                figures[f"leader_peak_rss_{kind}_mb"] = max(
                    figures[f"leader_peak_rss_{kind}_mb"],
                    _rss_mb(leader_pid, f"Rss{kind.capitalize()}"))
            for group in client.cluster_info().groups:
                if group.topic == topic:
                    figures["burst_peak_ready"] = max(figures["burst_peak_ready"], group.ready)
                    figures["burst_peak_leased"] = max(figures["burst_peak_leased"],
                                                       group.leased)
                    figures["burst_dropped"] = group.dropped


def _steady_figures(receipts: Receipts, calls: list[tuple[float, float]], due_ms: int,
                    last_ms: float) -> dict[str, float]:
    """The lateness of the steady topic's messages due from T to the burst's last receipt,
    and how long its schedule calls made in that time took."""
    numbers, arrivals, _ = _unpack(receipts)
    lateness = sorted(arrived - due for due, arrived in zip(numbers, arrivals, strict=True)
                      if due_ms <= due <= last_ms)
    schedule_ms = sorted(took_ms for called_ms, took_ms in calls
                         if due_ms <= called_ms <= last_ms)
    figures: dict[str, float] = {"steady_messages_during_burst": len(lateness)}
    if lateness:
        spread = percentiles("", lateness)
        figures.update({f"steady_lateness_{key}_ms": spread[key] for key in ("p50", "p99", "max")})
    if schedule_ms:
        spread = percentiles("", schedule_ms)
        figures.update({f"steady_schedule_{key}_ms": spread[key] for key in ("p50", "p99", "max")})
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument("--steady-rate", type=int, default=100)
    parser.add_argument("--steady-topics", type=int, default=1,
                        help="topics the steady rate is spread over, a consumer each")
    parser.add_argument("--schedule-rate", type=int, default=SCHEDULE_RATE,
                        help="messages a second the burst is scheduled at, before it is due")
    parser.add_argument("--no-ledger", action="store_true",
                        help="run the nodes without their ledger, to see what it costs")
    parser.add_argument("--ledger-segment-age-ms", type=int, default=LEDGER_SEGMENT_AGE_MS,
                        help="the nodes' --ledger-segment-age-ms (0: the node's default, 60 s)")
    args = parser.parse_args(argv)
    ledger_args = ("--no-ledger",) if args.no_ledger else ()
    with tempfile.TemporaryDirectory(prefix="tickwheel-burst-bench-") as root, \
            LocalCluster(Path(root), extra_args=ledger_args, metrics=True,
                         ledger_segment_age_ms=args.ledger_segment_age_ms or None) as cluster:
        cluster.leader(30)
        figures = burst(cluster, args.messages, args.producers, args.threads, args.consumers,
                        args.steady_rate, args.schedule_rate, args.steady_topics)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for key, value in figures.items():
            print(f"{key:34} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
