"""A full disk is an answer, not a crash (issue 18): real nodes, each on a small disk of its
own (a tmpfs), filled by a ballast file to below the reserve while messages wait.

Before this, a node accepted writes until its mapped journal touched a page the disk had no
room for, and died of SIGBUS (exit 135) with no word why. Now, while any member's disk is below
``min_free_bytes``: Schedule and Reschedule answer RESOURCE_EXHAUSTED naming that member, on
every node; cancels and delivery go on (what they write comes out of the reserve); no process
exits; and scheduling comes back by itself when the ballast goes.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from nodetests import now_ms, topic

from tickwheel.chaos.storage import empty, fill
from tickwheel.harness.acking_consumer import AckingConsumer
from tickwheel.harness.local_cluster import LocalCluster, LocalNode, wait_for
from tickwheel.v1 import tickwheel_pb2 as pb

pytestmark = pytest.mark.cluster

RESERVE = 8 << 20
DISK = "64m"
BODY = b"x" * 1024


def refusal(node: LocalNode, messages: list[pb.Message]) -> grpc.RpcError | None:
    """The error ``node`` answers a Schedule with, or None if it took the messages."""
    try:
        node.stub.Schedule(pb.ScheduleRequest(messages=messages), timeout=10)
    except grpc.RpcError as error:
        return error
    return None


def refused_for(node: LocalNode, member: LocalNode, name: str) -> bool:
    error = refusal(node, [pb.Message(id=f"{name}-{now_ms()}", topic="probe", delay_ms=60_000)])
    return (error is not None and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            and f"disk space low on {member.raft}" in (error.details() or ""))


def storage_health(node: LocalNode) -> int:
    node.stub  # noqa: B018 (opens the node's channel)
    health = health_pb2_grpc.HealthStub(node._channel)
    return health.Check(health_pb2.HealthCheckRequest(service="tickwheel.storage"),
                        timeout=5).status


def metric(node: LocalNode, name: str) -> str:
    with urllib.request.urlopen(f"http://{node.metrics_address}/metrics", timeout=5) as page:
        lines = page.read().decode().splitlines()
    return next(line for line in lines if line.startswith(name + " ") or
                line.startswith(name + "{"))


def test_a_disk_below_its_reserve_refuses_new_messages_delivers_the_rest_and_recovers(
        tmp_path: Path, small_disk: Callable[[str, str], Path]) -> None:
    root = tmp_path / "cluster"
    disks = [small_disk(f"cluster/node{i}", DISK) for i in range(3)]
    name = topic("disk")
    with LocalCluster(root, extra_args=("--min-free-bytes", str(RESERVE)), metrics=True
                      ) as cluster:
        leader = cluster.leader()
        follower = next(node for node in cluster.nodes if node is not leader)
        due_ms = now_ms() + 4_000
        stored = cluster.schedule([pb.Message(id=f"m{i}", topic=name, deliver_at_ms=due_ms,
                                              body=BODY) for i in range(300)])
        handles = [result.handle for result in stored.results]

        fill(disks[cluster.nodes.index(leader)], RESERVE // 2)
        for node in cluster.nodes:  # every member refuses, naming the leader
            wait_for(lambda node=node: refused_for(node, leader, "while-leader-low"), 10,
                     f"{node.raft} refusing for lack of space on the leader")
        # 8 MiB of bodies, twice what is left: every request refused, nobody dies
        for batch in range(16):
            error = refusal(leader, [pb.Message(id=f"big-{batch}-{i}", topic=name,
                                                delay_ms=1_000, body=BODY)
                                     for i in range(512)])
            assert error is not None and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        try:
            leader.stub.Reschedule(pb.RescheduleRequest(moves=[
                pb.Move(handle=handles[0], delay_ms=0)]), timeout=10)
            raise AssertionError("a reschedule was taken while the disk was low")
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        cancelled = leader.stub.Cancel(pb.CancelRequest(handles=handles[:20]), timeout=10)
        assert list(cancelled.outcomes) == [pb.CANCEL_OUTCOME_CANCELLED] * 20
        wait_for(lambda: storage_health(leader) == health_pb2.HealthCheckResponse.NOT_SERVING
                 and metric(leader, "tickwheel_disk_low") == "tickwheel_disk_low 1.0", 5,
                 "the leader's storage health and metric to say so")
        assert storage_health(follower) == health_pb2.HealthCheckResponse.SERVING

        received: set[str] = set()
        with AckingConsumer(cluster, name, on_message=lambda m: received.add(m.id)):
            wait_for(lambda: len(received) >= 280, 30, "the stored messages, delivered")
            assert received == {f"m{i}" for i in range(20, 300)}

            # the leader gets its space back and a follower runs out: the leader learns it
            empty(disks[cluster.nodes.index(leader)])
            fill(disks[cluster.nodes.index(follower)], RESERVE // 2)
            wait_for(lambda: refused_for(leader, follower, "while-follower-low"), 10,
                     "the leader refusing for lack of space on a follower")

            empty(disks[cluster.nodes.index(follower)])
            wait_for(lambda: refusal(leader, [pb.Message(id="after", topic=name,
                                                         delay_ms=0)]) is None,
                     10, "scheduling to come back once the space is back")
            wait_for(lambda: "after" in received, 15, "a message scheduled after recovery")
        wait_for(lambda: metric(leader, "tickwheel_disk_low") == "tickwheel_disk_low 0.0", 5,
                 "the metric to say so")  # refreshed by the housekeeping task
        assert all(node.alive() for node in cluster.nodes)
