"""``python -m tickwheel.harness.node_bench --json``: the service as users see it, via the client.

A 3-node cluster of real processes on 127.0.0.1, 100-byte bodies. Figures:

- ``grpc_schedule_msgs_per_s``: ``--producers`` processes of ``--threads`` threads, each sending
  batches of ``--batch`` messages with `Client.schedule_many`, saturating the cluster.
- ``grpc_schedule_single_per_s``: ``--single-threads`` threads calling `Client.schedule` with one
  message per call on one client, whose concurrent calls share requests (and the node's group
  commit packs concurrent requests into one Raft entry); with ``cluster_cpu_us_per_msg_single``
  and ``clients_cpu_us_per_msg_single``, the CPU a message costs the nodes and that client;
  ``grpc_schedule_single_async_per_s`` and its CPU figures (``..._single_async``): the same
  with as many asyncio tasks on one `AsyncClient`.
- ``lateness_p50_ms`` / ``lateness_p99_ms`` / ``lateness_max_ms`` at 1,000, 5,000 and 20,000 due
  messages per second: a producer schedules at that rate, each message due ``LEAD_S`` after it is
  sent (so scheduling and delivery run together, as in steady state), and ``--consumers``
  consumer processes receive and acknowledge. Lateness is the consumer's wall clock on receipt
  minus ``deliver_at_ms``: what a user's handler sees, network and client included.
- ``leader_cpu_us_per_msg`` at each rate: the leader's CPU time (all its threads, user and
  system) from the first schedule to the last arrival, divided by the messages: scheduling,
  hand-out, acks and sending, end to end. Steadier than p99 on a shared machine, and what
  decides the rate one leader can carry.
- ``cluster_cpu_us_per_msg`` at each rate: the same, summed over the three nodes: what a
  message costs the cluster (every replica files, readies, leases and resolves it).
- ``follower_cpu_us_per_msg`` at each rate: the same for the busier of the two followers.
- ``clients_cpu_us_per_msg`` at each rate: the same for the producer (this process) and the
  consumer processes. They share the machine with the nodes: at 20,000/s on 2 cores, what the
  clients take is what the cluster cannot have.
- ``capacity_delivered_per_s``: a lateness run offered more than the cluster carries
  (``--capacity-rate``, 30,000 due messages a second): the messages divided by the time from
  the first due time to the last arrival, what the cluster delivers when it is the
  bottleneck; with the CPU figures above at that load (``..._at_capacity``), the only ones
  that measure work per message rather than the cost of being awake (below saturation, a
  figure per message is mostly the fixed cost of a second divided by the rate).
- With ``--shards S``: S Raft groups of three nodes each, the clients spread over them (their
  ids hash to the shards); the leader and follower figures are per message of the node's
  shard (the leaders' mean), and ``leader_cores_min`` / ``_max`` at capacity say how busy the
  least and the most busy shard leader were at once (docs/benchmarks.md, "Shards").
- ``rocketmq_lateness_p50_ms`` / ``_p99_ms`` / ``_max_ms`` at each of ``--rocketmq-rates``
  (200 and 500 due messages per second): a run as above, on a fresh cluster, with a second
  consumer group beside the native one: ``--rocketmq-consumers`` processes of RocketMQ 5's
  official Python client (a PushConsumer with its 20 consumption threads, as RocketMQ users
  consume) on the leader's RocketMQ listener. Every message goes to both groups, so the two
  figures share one load (the native ones at these rates are ``lateness_*_at_200`` and
  ``_at_500``). The rates are low because RocketMQ clients ack one message per call, and a
  call costs the leader about a millisecond of CPU: on 2 cores the leader saturates near 700
  acks a second, with the native API's unary ack the same.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import multiprocessing
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.queues import Queue
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import TypedDict

from tickwheel.client import AsyncClient, Message
from tickwheel.client.shards import shard_of
from tickwheel.harness import rocketmq_consumer
from tickwheel.harness.bench_clients import (
    BODY,
    Endpoint,
    client_of,
    consumer_until,
    endpoint_of,
    now_ms,
    subscribed,
)
from tickwheel.harness.bench_figures import CPU_FIGURES, cpu_figures, cpu_s, percentiles
from tickwheel.harness.local_cluster import LocalCluster
from tickwheel.harness.processes import wait_for

HOUR_MS = 3_600_000
LEAD_S = 2.0
"""How long before its due time each message of the lateness runs is scheduled."""
PHASES = ("schedule", "lateness", "capacity")
"""What ``--only`` may pick: the two scheduling figures, the lateness runs, or the capacity run."""
CAPACITY_RATE = 30_000
"""Due messages a second offered to measure capacity: more than 2 cores carry."""
MAX_REQUEST_MSGS = 5_000
"""The lateness producer's largest request: after a stall it catches up in several, each
under the node's ``max_batch_msgs`` (10,000)."""

Figures = dict[str, float | str]
"""Figures by name (a few are words: how the run was secured, why a part was not run)."""


def _body(due_ms: int) -> bytes:
    """A 100-byte body that carries its due time: the RocketMQ consumer reads it from there."""
    return f"{due_ms}:".encode().ljust(len(BODY), b"x")


# -- schedule throughput ----------------------------------------------------------------------

def _produce(endpoint: Endpoint, prefix: str, requests: int, batch: int, threads: int,
             due_ms: int, start: Event) -> None:
    """One producer process: ``threads`` threads sharing ``requests`` batches."""
    batches = [[Message("bench", BODY, deliver_at_ms=due_ms + (r * batch + i) % HOUR_MS,
                        id=f"{prefix}-{r}-{i}") for i in range(batch)] for r in range(requests)]
    with client_of(endpoint, 120) as client:
        client.cluster_info()  # connected, before the clock starts
        start.wait()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(client.schedule_many, batches))


def schedule_batched(cluster: LocalCluster, total: int, producers: int, threads: int,
                     batch: int) -> float:
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    due_ms = now_ms() + 2 * HOUR_MS
    per_producer = total // batch // producers
    processes = [context.Process(target=_produce, args=(
        endpoint_of(cluster), f"b{p}", per_producer, batch, threads, due_ms, start))
        for p in range(producers)]
    for process in processes:
        process.start()
    time.sleep(3)  # let them build their batches and connect; the clock starts below
    began = time.perf_counter()
    start.set()
    for process in processes:
        process.join()
        if process.exitcode != 0:
            raise RuntimeError(f"a producer exited with {process.exitcode}")
    return per_producer * producers * batch / (time.perf_counter() - began)


def schedule_single(cluster: LocalCluster, seconds: float, threads: int) -> dict[str, float]:
    """``threads`` threads calling `Client.schedule` in a loop, one message a call, on one
    client (whose calls share requests): messages a second, and the CPU a message costs the
    cluster and this process."""
    due_ms = now_ms() + 3 * HOUR_MS
    counts = [0] * threads
    deadline = time.perf_counter() + seconds
    with client_of(endpoint_of(cluster), 60) as client:
        client.cluster_info()

        def run(thread: int) -> None:
            while time.perf_counter() < deadline:
                client.schedule("bench", BODY, deliver_at_ms=due_ms + counts[thread],
                                id=f"s{thread}-{counts[thread]}")
                counts[thread] += 1

        def threaded() -> None:
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(run, range(threads)))
        return _single_figures("", cluster, threaded, counts)


def schedule_single_async(cluster: LocalCluster, seconds: float, tasks: int
                          ) -> dict[str, float]:
    """`schedule_single` with ``tasks`` asyncio tasks on one `AsyncClient`."""
    due_ms = now_ms() + 4 * HOUR_MS
    counts = [0] * tasks
    address, credentials = endpoint_of(cluster)

    async def calls() -> None:
        async with AsyncClient(address, timeout_s=60, credentials=credentials) as client:
            await client.cluster_info()
            deadline = time.perf_counter() + seconds

            async def run(task: int) -> None:
                while time.perf_counter() < deadline:
                    await client.schedule("bench", BODY, deliver_at_ms=due_ms + counts[task],
                                          id=f"a{task}-{counts[task]}")
                    counts[task] += 1
            await asyncio.gather(*map(run, range(tasks)))
    return _single_figures("_async", cluster, lambda: asyncio.run(calls()), counts)


def _single_figures(suffix: str, cluster: LocalCluster, run: Callable[[], None],
                    counts: list[int]) -> dict[str, float]:
    """Messages a second over ``run`` (``counts``: each caller's messages), and the CPU a
    message costs the cluster and this process meanwhile."""
    pids = [node.pid for node in cluster.nodes]
    cluster_cpu_s, clients_cpu_s = sum(map(cpu_s, pids)), time.process_time()
    began = time.perf_counter()
    run()
    elapsed_s = time.perf_counter() - began
    cluster_cpu_s = sum(map(cpu_s, pids)) - cluster_cpu_s
    clients_cpu_s = time.process_time() - clients_cpu_s
    total = sum(counts)
    return {f"grpc_schedule_single{suffix}_per_s": round(total / elapsed_s),
            f"cluster_cpu_us_per_msg_single{suffix}": round(1e6 * cluster_cpu_s / total, 1),
            f"clients_cpu_us_per_msg_single{suffix}": round(1e6 * clients_cpu_s / total, 1)}


# -- lateness at a due rate -------------------------------------------------------------------

def _consume(endpoint: Endpoint, topic: str, received: Synchronized[int], stop: Event,
             results: Queue[tuple[list[float], float]]) -> None:
    """One consumer process: receive and ack, noting each message's lateness on receipt."""
    lateness: list[float] = []
    last_arrival_ms = 0.0
    with client_of(endpoint, 120) as client:
        consumer = consumer_until(client, topic, f"bench-{topic}", stop)
        for message in consumer:
            last_arrival_ms = time.time_ns() / 1e6
            lateness.append(last_arrival_ms - message.deliver_at_ms)
            message.ack()
            with received.get_lock():
                received.value += 1
    results.put((lateness, last_arrival_ms))


def lateness_at(cluster: LocalCluster, rate: int, seconds: float, consumers: int,
                rocketmq_consumers: int = 0) -> dict[str, float]:
    """The native consumers' lateness at ``rate`` due messages per second, and with
    ``rocketmq_consumers`` the RocketMQ group's (``rocketmq_p50`` and so on) in the same run."""
    context = multiprocessing.get_context("spawn")
    topic = f"due-{rate}"
    received, stop = context.Value(ctypes.c_longlong, 0), context.Event()
    results: Queue[tuple[list[float], float]] = context.Queue()
    processes = [context.Process(target=_consume, args=(endpoint_of(cluster), topic, received,
                                                         stop, results))
                 for _ in range(consumers)]
    rocketmq_received = context.Value(ctypes.c_longlong, 0)
    warmed = context.Value(ctypes.c_longlong, 0)
    rocketmq_results: Queue[list[float]] = context.Queue()
    rocketmq_endpoint = rocketmq_consumer.endpoint(cluster) if rocketmq_consumers else None
    rocketmq_processes = [context.Process(target=rocketmq_consumer.consume, args=(
        rocketmq_endpoint, topic, rocketmq_received, warmed, stop, rocketmq_results))
        for _ in range(rocketmq_consumers)]
    for process in processes + rocketmq_processes:
        process.start()
    wait_for(lambda: subscribed(cluster, topic) == consumers, 30, "the consumers to subscribe")
    if rocketmq_consumers:
        _warm_up(cluster, f"{topic}-warmup", warmed, rocketmq_consumers)
    total = int(rate * seconds)
    tick_s = 0.01
    leaders = cluster.leaders()
    pids = [node.pid for node in cluster.nodes]
    started_cpu_s = {pid: cpu_s(pid) for pid in pids}
    client_pids = [pid for process in processes + rocketmq_processes
                   if (pid := process.pid) is not None]  # every one: all are started
    clients_cpu_s = time.process_time() + sum(map(cpu_s, client_pids))
    with client_of(endpoint_of(cluster), 60) as client:
        began = time.monotonic()
        first_due_ms = now_ms() + int(LEAD_S * 1000)
        sent = 0
        while sent < total:
            due_now = min(total, int((time.monotonic() - began) * rate) + 1,
                          sent + MAX_REQUEST_MSGS)
            if due_now > sent:
                client.schedule_many(
                    Message(topic, _body(due_ms), deliver_at_ms=due_ms, id=f"{topic}-{k}")
                    for k in range(sent, due_now)
                    for due_ms in (first_due_ms + k * 1000 // rate,))
                sent = due_now
            else:
                time.sleep(tick_s)
        behind_s = time.monotonic() - began - seconds
    wait_for(lambda: received.value >= total, LEAD_S + max(60.0, total / 2_000),
             f"{total} messages to arrive", poll_s=0.1)
    if rocketmq_consumers:
        wait_for(lambda: rocketmq_received.value >= total, 60,
                 f"{total} messages to reach the RocketMQ group", poll_s=0.1)
    used_cpu_s = {pid: cpu_s(pid) - started for pid, started in started_cpu_s.items()}
    clients_cpu_s = time.process_time() + sum(map(cpu_s, client_pids)) - clients_cpu_s
    elapsed_s = time.monotonic() - began
    stop.set()
    arrivals = [results.get(timeout=30) for _ in processes]
    lateness = sorted(value for values, _ in arrivals for value in values)
    last_arrival_ms = max(last for _, last in arrivals)
    figures = {**percentiles("", lateness), "producer_behind_s": round(max(0.0, behind_s), 3),
               "delivered_per_s": round(total / ((last_arrival_ms - first_due_ms) / 1000)),
               **cpu_figures(cluster.shards, leaders, used_cpu_s, clients_cpu_s,
                             _per_shard(topic, total, len(cluster.shards)), elapsed_s)}
    if rocketmq_consumers:
        figures |= percentiles("rocketmq_", sorted(
            value for _ in rocketmq_processes for value in rocketmq_results.get(timeout=60)))
    for process in processes + rocketmq_processes:
        process.join(10)
    return figures


def _per_shard(topic: str, total: int, shards: int) -> list[int]:
    """How many of the lateness run's messages (ids ``topic-k``) each shard holds."""
    counts = Counter(shard_of(f"{topic}-{k}", shards) for k in range(total))
    return [counts[shard] for shard in range(shards)]


def _warm_up(cluster: LocalCluster, topic: str, warmed: Synchronized[int],
             consumers: int) -> None:
    """Send messages due now to ``topic`` until the RocketMQ consumers have taken ``consumers``
    of them: their long polls are running before the clock starts (competing in one group,
    one of them may take several; enough for the client to be past its start-up)."""
    with client_of(endpoint_of(cluster), 60) as client:
        deadline = time.monotonic() + 60
        while warmed.value < consumers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the RocketMQ consumers took {warmed.value} of "
                                   f"{consumers} warm-up messages in 60 s")
            client.schedule(topic, b"warm-up", deliver_at_ms=now_ms())
            time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a small run, to check it works")
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--single-threads", type=int, default=16,
                        help="threads, then asyncio tasks, calling schedule a message a call")
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument("--rates", default="1000,5000,20000")
    parser.add_argument("--rocketmq-rates", default="200,500",
                        help="rates run with a RocketMQ consumer group beside the native one "
                             "(\"\" for none)")
    parser.add_argument("--rocketmq-consumers", type=int, default=2)
    parser.add_argument("--capacity-rate", type=int, default=CAPACITY_RATE,
                        help="due messages a second offered to measure capacity (0: none)")
    parser.add_argument("--only", choices=PHASES, help="run one phase (figures keep their keys)")
    parser.add_argument("--shards", type=int, default=1,
                        help="Raft groups of three nodes each (docs/shards.md)")
    parser.add_argument("--insecure-raft", action="store_true",
                        help="Raft links in the clear, to measure what their encryption costs")
    parser.add_argument("--insecure-grpc", action="store_true",
                        help="gRPC in plaintext without tokens, to measure what TLS costs")
    args = parser.parse_args(argv)
    figures: Figures = {"raft_links": "insecure" if args.insecure_raft else "secret",
                     "grpc": "plaintext" if args.insecure_grpc else "tls+token",
                     "shards": args.shards}
    with tempfile.TemporaryDirectory(prefix="tickwheel-node-bench-") as root:
        if args.only in (None, "schedule"):
            figures |= _schedule_phase(Path(root) / "schedule", args)
        if args.only in (None, "lateness"):
            figures |= _lateness_phase(Path(root), args)
        if args.only in (None, "capacity") and args.capacity_rate:
            figures |= _capacity_phase(Path(root) / "capacity", args)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for key, value in figures.items():
            print(f"{key:34} {value}")
    return 0


class _Shape(TypedDict):
    """How a benchmark's cluster is secured and sharded: `LocalCluster`'s flags of the same
    names."""

    insecure_raft: bool
    insecure_grpc: bool
    shards: int


def _settled(cluster: LocalCluster) -> None:
    """Wait for every shard's leader, and in a cluster of several shards for each to be its
    preferred member: a hand-over in the middle of a run moves a shard's leader under load
    (and RocketMQ consumers learn of it only at their next assignment query)."""
    cluster.leaders(30)
    cluster.placed()


def _secured(args: argparse.Namespace) -> _Shape:
    return {"insecure_raft": args.insecure_raft, "insecure_grpc": args.insecure_grpc,
            "shards": args.shards}


def _due_s(args: argparse.Namespace) -> float:
    return 2.0 if args.quick else 10.0


def _schedule_phase(root: Path, args: argparse.Namespace) -> Figures:
    with LocalCluster(root, **_secured(args)) as cluster:
        _settled(cluster)
        return {"grpc_schedule_msgs_per_s": round(schedule_batched(
                    cluster, 40_000 if args.quick else 400_000, args.producers, args.threads,
                    args.batch)),
                **schedule_single(cluster, 2.0 if args.quick else 10.0, args.single_threads),
                **schedule_single_async(cluster, 2.0 if args.quick else 10.0,
                                        args.single_threads)}


def _lateness_phase(root: Path, args: argparse.Namespace) -> Figures:
    figures: Figures = {}
    rocketmq_rates = {int(r) for r in args.rocketmq_rates.split(",") if r}
    if rocketmq_rates and (args.insecure_raft or args.insecure_grpc):
        rocketmq_rates = set()
        figures["rocketmq"] = "not run: its listener needs TLS and a Raft secret"
    for rate in sorted({int(r) for r in args.rates.split(",") if r} | rocketmq_rates):
        beside = args.rocketmq_consumers if rate in rocketmq_rates else 0
        # A fresh cluster per rate: nothing left over from the previous load.
        with LocalCluster(root / f"due{rate}", rocketmq=bool(beside),
                          **_secured(args)) as cluster:
            _settled(cluster)
            run = lateness_at(cluster, rate, _due_s(args), args.consumers, beside)
        for prefix in ("", "rocketmq_") if beside else ("",):
            for key in ("p50", "p99", "max"):
                figures[f"{prefix}lateness_{key}_ms_at_{rate}"] = run[f"{prefix}{key}"]
        figures[f"producer_behind_s_at_{rate}"] = run["producer_behind_s"]
        for key in CPU_FIGURES:
            figures[f"{key}_at_{rate}"] = run[key]
    return figures


def _capacity_phase(root: Path, args: argparse.Namespace) -> Figures:
    """A lateness run offered ``--capacity-rate``: what the cluster delivers a second when it
    is the bottleneck, and the CPU a message costs at that load."""
    with LocalCluster(root, **_secured(args)) as cluster:
        _settled(cluster)
        run = lateness_at(cluster, args.capacity_rate, _due_s(args), args.consumers)
    return {"capacity_offered_per_s": args.capacity_rate,
            "capacity_delivered_per_s": run["delivered_per_s"],
            "producer_behind_s_at_capacity": run["producer_behind_s"],
            "leader_cores_min_at_capacity": run["leader_cores_min"],
            "leader_cores_max_at_capacity": run["leader_cores_max"],
            **{f"{key}_at_capacity": run[key] for key in CPU_FIGURES}}


if __name__ == "__main__":
    sys.exit(main())
