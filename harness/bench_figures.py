"""The figures of a node_bench run (`tickwheel.harness.node_bench`): what its CPU comes to per
message, for a cluster of one shard or of several, and the lateness percentiles."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from tickwheel.harness.local_cluster import LocalNode

CPU_FIGURES = ("leader_cpu_us_per_msg", "follower_cpu_us_per_msg", "cluster_cpu_us_per_msg",
               "clients_cpu_us_per_msg")


def cpu_s(pid: int) -> float:
    """The CPU time a process has used so far, user and system (Linux's /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_figures(shards: list[list[LocalNode]], leaders: list[LocalNode],
                used_s: dict[int, float], clients_s: float, per_shard: list[int],
                elapsed_s: float) -> dict[str, float]:
    """Per message: a leader's CPU (over its shard's messages, the mean of the shards'), the
    busiest follower's (over its shard's), the whole cluster's and the clients' (over all);
    and how busy the shards' leaders were at once (cores, the least and the most busy).

    ``used_s``: CPU seconds by PID over the run; ``per_shard``: the messages of each shard;
    ``elapsed_s``: the run's wall time."""
    total = sum(per_shard)
    leader_us = [1e6 * used_s[leader.pid] / max(1, count)
                 for leader, count in zip(leaders, per_shard, strict=True)]
    follower_us = [1e6 * used_s[node.pid] / max(1, count)
                   for members, leader, count in zip(shards, leaders, per_shard, strict=True)
                   for node in members if node is not leader]
    leader_cores = [used_s[leader.pid] / elapsed_s for leader in leaders]
    return {"leader_cpu_us_per_msg": round(sum(leader_us) / len(leader_us), 1),
            "follower_cpu_us_per_msg": round(max(follower_us, default=0.0), 1),
            "cluster_cpu_us_per_msg": round(1e6 * sum(used_s.values()) / total, 1),
            "clients_cpu_us_per_msg": round(1e6 * clients_s / total, 1),
            "leader_cores_min": round(min(leader_cores), 2),
            "leader_cores_max": round(max(leader_cores), 2)}


def percentiles(prefix: str, lateness: list[float]) -> dict[str, float]:
    return {f"{prefix}p50": round(statistics.median(lateness), 2),
            f"{prefix}p99": round(lateness[int(0.99 * (len(lateness) - 1))], 2),
            f"{prefix}max": round(lateness[-1], 2), f"{prefix}messages": len(lateness)}
