"""``python -m tickwheel.harness.replication_bench --json``: a 3-node cluster of real processes.

Figures (100-byte bodies, nodes on 127.0.0.1, this process as the client):

- ``schedule_msgs_per_s``: saturated, ``--clients`` threads each sending batches of
  ``--batch`` messages; group commit packs concurrent requests into entries.
- ``commit_p50_ms`` / ``commit_p99_ms``: request latency at 10,000 msg/s offered (requests of
  20 messages, 500 per second, each timed from when it was *due* to be sent, so a stall
  counts against the figure instead of slowing the load).
- ``failover_to_first_delivery_s``: median over ``--kills`` SIGKILLs of the leader, from the
  kill to the first delivery by its successor, with a message due every 10 ms and a consumer
  (client library) that acknowledges each.
- ``rss_mb_per_node`` and ``snapshot_s_1m_pending``: with ``--pending`` (1 M) messages pending.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tickwheel.harness.acking_consumer import AckingConsumer
from tickwheel.harness.local_cluster import LocalCluster, LocalNode
from tickwheel.harness.processes import wait_for
from tickwheel.v1 import tickwheel_pb2 as pb

BODY = b"x" * 100
HOUR_MS = 3_600_000

Figure = float | str | list[float] | None
"""A figure of the report (None: not measured)."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def batch_of(prefix: str, count: int, due_ms: int) -> list[pb.Message]:
    return [pb.Message(id=f"{prefix}-{i}", topic="bench", body=BODY,
                       deliver_at_ms=due_ms + i % HOUR_MS) for i in range(count)]


def saturated(cluster: LocalCluster, total: int, clients: int, batch: int) -> float:
    leader = cluster.leader()
    due_ms = now_ms() + 2 * HOUR_MS
    requests = [batch_of(f"sat{r}", batch, due_ms) for r in range(total // batch)]

    def send(messages: list[pb.Message]) -> None:
        leader.stub.Schedule(pb.ScheduleRequest(messages=messages), timeout=30)
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(send, requests))
    return len(requests) * batch / (time.perf_counter() - started)


def settled(cluster: LocalCluster) -> None:
    """Wait until every node has applied everything the leader committed."""
    info = cluster.leader().info()
    if info is None:
        raise RuntimeError("the leader did not answer ClusterInfo")
    commit = info.commit_index
    wait_for(lambda: all((i := n.info()) and i.last_applied >= commit for n in cluster.nodes),
             120, "every node to apply the load")


def commit_latency(cluster: LocalCluster, seconds: float) -> tuple[float, float]:
    settled(cluster)
    leader = cluster.leader()
    due_ms = now_ms() + 3 * HOUR_MS
    rate_per_s, size = 500, 20
    latencies: list[float] = []
    lock = threading.Lock()
    start = time.perf_counter() + 0.1

    def send(number: int) -> None:
        planned = start + number / rate_per_s
        time.sleep(max(0.0, planned - time.perf_counter()))
        messages = batch_of(f"lat{number}", size, due_ms)
        leader.stub.Schedule(pb.ScheduleRequest(messages=messages), timeout=30)
        with lock:
            latencies.append((time.perf_counter() - planned) * 1000)
    with ThreadPoolExecutor(32) as pool:
        list(pool.map(send, range(int(seconds * rate_per_s))))
    latencies.sort()
    return (statistics.median(latencies), latencies[int(0.99 * (len(latencies) - 1))])


def failover(cluster: LocalCluster, kills: int) -> list[float]:
    times: list[float] = []
    for kill in range(kills):
        leader = cluster.leader(30)
        first_due = now_ms() + 1_000
        cluster.schedule([pb.Message(id=f"fo{kill}-{i}", topic="bench", body=BODY,
                                     deliver_at_ms=first_due + 10 * i) for i in range(1_000)])
        def delivered(leader: LocalNode = leader, prefix: str = f"fo{kill}-") -> bool:
            return any(row["id"].startswith(prefix) for row in leader.ledger("sent"))
        wait_for(delivered, 10, "the leader to deliver")
        killed_ms = now_ms()
        cluster.signal(leader, signal.SIGKILL)
        survivors = [n for n in cluster.nodes if n is not leader]

        def first_delivery(survivors: list[LocalNode] = survivors,
                           killed_ms: int = killed_ms) -> int | None:
            stamps = [row["time_ms"] for n in survivors for row in n.ledger("sent")
                      if row["time_ms"] >= killed_ms]
            return min(stamps) if stamps else None
        times.append((wait_for(first_delivery, 30, "a delivery after the kill") - killed_ms)
                     / 1000)
        cluster.start(leader)
        wait_for(lambda: all(n.info() for n in cluster.nodes), 30, "the node to restart")
        time.sleep(12)  # let every message of this round be delivered before the next kill
    return times


def rss_mb(node: LocalNode) -> float:
    status = Path(f"/proc/{node.pid}/status").read_text()
    found = re.search(r"VmRSS:\s+(\d+)", status)
    if found is None:
        raise RuntimeError(f"no VmRSS in /proc/{node.pid}/status")
    return int(found.group(1)) / 1024


def pending_figures(cluster: LocalCluster, pending: int, clients: int) -> dict[str, Figure]:
    saturated(cluster, pending, clients, 1_000)
    settled(cluster)
    leader = cluster.leader()
    durations = [float(m) for m in re.findall(r"event=snapshot_taken .*duration_ms=([\d.]+)",
                                              leader.log_path.read_text())]
    return {"rss_mb_per_node": round(max(rss_mb(n) for n in cluster.nodes), 1),
            "snapshot_s_1m_pending": round(durations[-1] / 1000, 4) if durations else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a small run, to check it works")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--insecure-raft", action="store_true",
                        help="Raft links in the clear, to measure what their encryption costs")
    args = parser.parse_args(argv)
    saturated_total = 20_000 if args.quick else 200_000
    latency_s = 2.0 if args.quick else 10.0
    kills = 1 if args.quick else args.kills
    pending = 20_000 if args.quick else args.pending
    with tempfile.TemporaryDirectory(prefix="tickwheel-bench-") as root:
        with LocalCluster(Path(root) / "rates", insecure_raft=args.insecure_raft) as cluster:
            schedule_msgs_per_s = saturated(cluster, saturated_total, args.clients, args.batch)
            figures: dict[str, Figure] = {"schedule_msgs_per_s": round(schedule_msgs_per_s)}
            p50, p99 = commit_latency(cluster, latency_s)
            figures |= {"commit_p50_ms": round(p50, 2), "commit_p99_ms": round(p99, 2)}
            with AckingConsumer(cluster, "bench"):
                times = failover(cluster, kills)
            figures |= {"failover_to_first_delivery_s": round(statistics.median(times), 3),
                        "failover_runs_s": [round(t, 3) for t in times]}
        with LocalCluster(Path(root) / "pending", insecure_raft=args.insecure_raft) as cluster:
            figures |= pending_figures(cluster, pending, args.clients)
    figures["pending_msgs"] = pending
    figures["raft_links"] = "insecure" if args.insecure_raft else "secret"
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for key, value in figures.items():
            print(f"{key:32} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
