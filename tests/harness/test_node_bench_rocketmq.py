"""The node benchmark's RocketMQ leg, on a small load: a group of the official Python client's
PushConsumers beside a native group of one topic, both receiving every message of one run (the
figures in docs/rocketmq.md come from it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tickwheel.harness.local_cluster import LocalCluster
from tickwheel.harness.node_bench import lateness_at

pytestmark = pytest.mark.cluster


def test_both_groups_get_every_message_of_one_load_and_report_their_lateness(
        tmp_path: Path) -> None:
    with LocalCluster(tmp_path, 3, rocketmq=True) as cluster:
        cluster.leader(timeout_s=30)
        run = lateness_at(cluster, rate=100, seconds=1.0, consumers=1, rocketmq_consumers=1)
    assert run["messages"] == 100 and run["rocketmq_messages"] == 100
    for prefix in ("", "rocketmq_"):
        # nothing early (a little clock jitter between processes aside), nothing absurdly late
        assert -5 < run[f"{prefix}p50"] <= run[f"{prefix}p99"] <= run[f"{prefix}max"] < 30_000
    # the leader's CPU from the first schedule to the last arrival, per message: some, and
    # less than the whole run's wall time could hold
    assert 0 < run["leader_cpu_us_per_msg"] < 1e6 * 60 / 100
    # and the three nodes together: more than the leader alone (the followers apply it all)
    assert run["leader_cpu_us_per_msg"] < run["cluster_cpu_us_per_msg"] < 3 * 1e6 * 60 / 100
    assert 0 < run["follower_cpu_us_per_msg"] < run["cluster_cpu_us_per_msg"]
    assert run["delivered_per_s"] > 0
    # the producer (this process) and both consumers, which share the machine with the nodes
    assert 0 < run["clients_cpu_us_per_msg"] < 3 * 1e6 * 60 / 100
