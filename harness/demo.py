"""``make demo``: two shards of three nodes on this machine, one shard's leader killed
mid-delivery, the other shard delivering throughout, nothing lost.

Starts six ``tickwheel serve`` processes (two Raft groups of three, under ``data/demo``;
``--shards 1`` for one group), schedules messages due over the next few seconds through the
client library (each lands on the shard its id hashes to), consumes them with one consumer, and
SIGKILLs shard 0's leader half-way; a web console (`tickwheel.harness.console_process`) runs
beside it, and its address is printed. Every arrival is printed with its lateness, its shard and
the node that sent it; shard 0's new leader carries on. Exits 0 only if every message arrived;
stops every process it started.
"""

from __future__ import annotations

import argparse
import math
import shutil
import signal
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tickwheel.client import Client, Message, Received
from tickwheel.client.shards import shard_of
from tickwheel.harness.console_process import ConsoleProcess
from tickwheel.harness.local_cluster import LocalCluster, LocalNode

console = Console(highlight=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tickwheel.harness.demo", description=__doc__)
    parser.add_argument("--messages", type=int, default=60)
    parser.add_argument("--span-s", type=float, default=6.0,
                        help="messages are due evenly over this many seconds")
    parser.add_argument("--data", type=Path, default=Path("data/demo"))
    parser.add_argument("--shards", type=int, default=2, help="Raft groups of three nodes")
    args = parser.parse_args(argv)
    shutil.rmtree(args.data, ignore_errors=True)
    console.print(f"[bold]starting a tickwheel cluster of {args.shards} shard(s) of 3 nodes"
                  f"[/bold] in {args.data}")
    with LocalCluster(args.data.resolve(), shards=args.shards) as cluster, ConsoleProcess(
            cluster) as web:
        cluster.leaders(timeout_s=30)
        console.print(f"web console: {web.url} (token: {web.token_file()}); it stops with "
                      "the demo, `tickwheel cluster up --console` keeps one", highlight=False)
        # with shards, each shard's leader on a member of its own (docs/shards.md)
        leaders = cluster.placed(timeout_s=60)
        for shard, leader in enumerate(leaders):
            console.print(f"shard {shard} leader: {leader.raft} (gRPC {leader.grpc_address}, "
                          f"pid {leader.pid})")
        with cluster.client(timeout_s=60) as client:
            got = _run(cluster, client, leaders[0], args.messages, args.span_s)
    return _report(got, args.messages, args.shards)


def _run(cluster: LocalCluster, client: Client, leader: LocalNode, count: int,
         span_s: float) -> dict[str, list[Received]]:
    start_ms = time.time_ns() // 1_000_000 + 1_000
    messages = [Message("demo", f"reminder #{i}", deliver_at_ms=start_ms + int(
        span_s * 1000 * i / count), id=f"demo-{i}") for i in range(count)]
    client.schedule_many(messages)
    shards = len(cluster.shards)
    console.print(f"scheduled {count} messages due over the next {span_s:.0f} s; "
                  f"{'shard 0' if shards > 1 else 'the'} leader is killed half-way")
    killer = threading.Timer(1 + span_s / 2, _kill, (cluster, leader))
    killer.start()
    got: dict[str, list[Received]] = {}
    try:
        with client.consume("demo", prefetch=256) as consumer:
            for message in consumer:
                got.setdefault(message.id, []).append(message)
                message.ack()
                flag = " [yellow]possible duplicate[/yellow]" if (
                    message.possible_duplicate) else ""
                shard = f"shard {shard_of(message.id, shards)}  " if shards > 1 else ""
                console.print(f"  {message.id:>9}  late {message.lateness_ms:>5} ms  "
                              f"{shard}from {message.node}{flag}")
                if len(got) == count:
                    break
    finally:
        killer.cancel()
    return got


def _kill(cluster: LocalCluster, leader: LocalNode) -> None:
    console.print(f"[red bold]SIGKILL leader {leader.raft} (pid {leader.pid})[/red bold]")
    cluster.signal(leader, signal.SIGKILL)


def _report(got: dict[str, list[Received]], count: int, shards: int) -> int:
    table = Table(title="demo summary")
    for column in ("shard", "arrived", "delivered twice (flagged)",
                   "lateness p50 / p99 / max (ms)"):
        table.add_column(column)
    for shard in range(shards):
        mine = [m for message_id, m in got.items() if shard_of(message_id, shards) == shard]
        lateness = [m[0].lateness_ms for m in mine]
        figures = " / ".join(map(str, lateness_percentiles(lateness))) if lateness else "-"
        table.add_row(f"{shard}{' (leader killed)' if shard == 0 else ''}", str(len(mine)),
                      str(sum(len(m) > 1 for m in mine)), figures)
    console.print(table)
    console.print("lateness spikes around the kill on the shard that lost its leader: its new "
                  "leader is elected within about a second and then delivers what came due "
                  "meanwhile" + ("; the other shard delivers on time throughout." if shards > 1
                                 else "."))
    if len(got) != count:
        console.print(f"[red]{count - len(got)} messages did not arrive[/red]")
        return 1
    console.print(f"[green]every one of the {count} messages arrived; the cluster is "
                  "stopped[/green]")
    return 0


def lateness_percentiles(lateness_ms: list[int]) -> tuple[int, int, int]:
    """p50, p99 and max of ``lateness_ms`` (not empty), nearest-rank as the chaos audit reports
    them: each percentile is one of the samples, so p50 <= p99 <= max. `statistics.quantiles`
    (its default method) extrapolates past the largest sample when there are fewer than 99,
    and printed a p99 of 683 ms over a max of 644 ms."""
    ordered = sorted(lateness_ms)

    def nearest_rank(percent: int) -> int:
        return ordered[math.ceil(percent * len(ordered) / 100) - 1]
    return nearest_rank(50), nearest_rank(99), ordered[-1]


if __name__ == "__main__":
    raise SystemExit(main())
