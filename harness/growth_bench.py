"""``python -m tickwheel.harness.growth_bench --json``: what growing a running cluster costs.

A cluster of two shards of ``--size`` real node processes each holds ``--messages`` messages
(due in an hour); it grows to four shards (`LocalCluster.grow`). Figures:

- ``grow_s``: from starting the new shards' nodes to the last old shard taking the new map
  (their elections, the groups copied, `GrowShards` on each old shard);
- ``switch_s``: of that, `Client.grow_shards`: the groups copied and the old shards taking
  the map;
- then, inside the dedupe window, batches of ``--batch`` new ids sent one after the other to
  an old shard and to a shard added (which asks the id's previous shard about each batch):
  ``old_shard_batch_ms_p50`` / ``_p99`` / ``_max`` and ``new_shard_batch_ms_...``, and
  each leader's CPU per message (``old_leader_cpu_us_per_msg``,
  ``new_leader_cpu_us_per_msg``, the new one's with the previous shard's leader's CPU for
  answering it added);
- ``retried_duplicates``: the ids scheduled before the growth sent again with the new map:
  how many were answered as duplicates (all of them, or the growth broke idempotency), and
  ``retry_batch_ms_p50`` / ``_p99`` / ``_max`` for those batches.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tickwheel.client import Client, Message
from tickwheel.client.shards import shard_of
from tickwheel.harness.bench_figures import cpu_s, percentiles
from tickwheel.harness.local_cluster import LocalCluster

HOUR_MS = 3_600_000


def _ids_of(topic: str, shard: int, shards: int, count: int) -> list[str]:
    """``count`` fresh ids of ``topic`` that the map of ``shards`` puts on ``shard``."""
    found: list[str] = []
    while len(found) < count:
        candidate = f"{topic}-{uuid.uuid4().hex}"
        if shard_of(candidate, shards) == shard:
            found.append(candidate)
    return found


def _batches(client: Client, topic: str, ids: list[str], batch: int) -> list[float]:
    """Send ``ids`` in batches one after the other; each batch's time, in ms."""
    due_ms = int(time.time() * 1000) + HOUR_MS
    took: list[float] = []
    for start in range(0, len(ids), batch):
        messages = [Message(topic, b"x" * 100, deliver_at_ms=due_ms, id=message_id)
                    for message_id in ids[start:start + batch]]
        began = time.perf_counter()
        client.schedule_many(messages)
        took.append((time.perf_counter() - began) * 1000)
    return took


def run(size: int, messages: int, batch: int) -> dict[str, float]:
    topic = f"grow-{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory(prefix="tickwheel-growth-bench-") as root, LocalCluster(
            Path(root), size, shards=2) as cluster, cluster.client(timeout_s=120) as client:
        cluster.placed(timeout_s=60)
        before = [f"{topic}-before-{n}" for n in range(messages)]
        _batches(client, topic, before, 500)
        began = time.perf_counter()
        new = cluster.start_shards(2)
        switching = time.perf_counter()
        version = client.grow_shards([[node.grpc_address for node in nodes] for nodes in new],
                                     [[node.peer_address for node in nodes] for nodes in new])
        grow_s, switch_s = time.perf_counter() - began, time.perf_counter() - switching
        leaders = cluster.placed(timeout_s=60)
        client.refresh_shards()
        figures: dict[str, float] = {"grow_s": round(grow_s, 2), "switch_s": round(switch_s, 2),
                                     "map_version": version}
        for name, shard in (("old_shard", 0), ("new_shard", 2)):
            ids = _ids_of(topic, shard, 4, messages // 2)
            previous = leaders[shard_of(ids[0], 2)]
            cpu_before = (cpu_s(leaders[shard].pid), cpu_s(previous.pid))
            took = _batches(client, topic, ids, batch)
            leader_cpu = cpu_s(leaders[shard].pid) - cpu_before[0]
            asked_cpu = cpu_s(previous.pid) - cpu_before[1] if shard >= 2 else 0.0
            figures.update(percentiles(f"{name}_batch_ms_", sorted(took)))
            figures[f"{name.replace('shard', 'leader')}_cpu_us_per_msg"] = round(
                (leader_cpu + asked_cpu) / len(ids) * 1e6, 1)
        retried = [message_id for message_id in before if shard_of(message_id, 4) >= 2]
        due_ms = int(time.time() * 1000) + HOUR_MS
        duplicates, took = 0, []
        for start in range(0, len(retried), batch):
            began = time.perf_counter()
            results = client.schedule_many([Message(topic, b"x" * 100, deliver_at_ms=due_ms,
                                                    id=message_id)
                                            for message_id in retried[start:start + batch]])
            took.append((time.perf_counter() - began) * 1000)
            duplicates += sum(1 for result in results if result.duplicate)
        figures["retried"] = len(retried)
        figures["retried_duplicates"] = duplicates
        figures.update(percentiles("retry_batch_ms_", sorted(took)))
        return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--size", type=int, default=3, help="replicas per shard")
    parser.add_argument("--messages", type=int, default=4_000)
    parser.add_argument("--batch", type=int, default=50)
    args = parser.parse_args(argv)
    figures = run(args.size, args.messages, args.batch)
    print(json.dumps(figures) if args.json else json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
