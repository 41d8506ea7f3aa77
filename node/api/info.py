"""``ClusterInfo``: the cluster as one node sees it, and how far its cursor trails; and
``DueHistogram``: how many messages are due when (`tickwheel.wheel.due` counts them)."""

from __future__ import annotations

from tickwheel.common.errors import PermissionDenied
from tickwheel.common.versions import CURRENT
from tickwheel.node.api.context import NodeContext
from tickwheel.node.api.validation import check_topic
from tickwheel.node.security.access import ANYONE, Principal
from tickwheel.replication import ReplicaStatus
from tickwheel.v1 import tickwheel_pb2 as pb


def cluster_info(node: NodeContext, principal: Principal = ANYONE) -> pb.ClusterInfoResponse:
    """The cluster as this node sees it; topics and groups only those ``principal`` has some
    grant on."""
    status = node.replica.status()
    sees = principal.sees
    leading = status.role == "leader"
    members = [pb.Member(raft_address=status.address, grpc_address=node.members[status.address],
                         role=status.role, connected=True, version=CURRENT)]
    heard = node.replica.upgrade.member_versions() if leading else {}
    for peer in status.peers:
        lag = max(0, status.commit_index - status.match_index[peer]) if (
            leading and peer in status.match_index) else 0
        role = "leader" if peer == status.leader else ("follower" if leading else "unknown")
        members.append(pb.Member(raft_address=peer, grpc_address=node.members[peer], role=role,
                                 connected=peer in status.connected, lag_entries=lag,
                                 version=heard[peer].version if peer in heard else 0))
    _clocks_and_disks(node, members)
    topics = [pb.TopicInfo(topic=topic, ready=ready, unacked=unacked, consumers=consumers,
                           delivered=node.metrics.delivered_of(topic))
              for topic, ready, unacked, consumers in node.courier.topics() if sees(topic)]
    lag_ms = cursor_lag_ms(status, node.clock.now_ms())
    return pb.ClusterInfoResponse(
        address=status.address, role=status.role, leader=status.leader or "",
        leader_grpc=node.leader_grpc(status.leader) or "", term=status.term,
        commit_index=status.commit_index, last_applied=status.last_applied,
        cursor_second=status.cursor.second, cursor_local_index=status.cursor.local_index,
        stamp_ms=status.stamp_ms, dispatching=status.dispatching, members=members,
        topics=topics, cursor_lag_ms=lag_ms, readied_past_cursor=status.readied_past_cursor,
        groups=[pb.GroupInfo(topic=g.topic, group=g.name, ready=g.ready, leased=g.leased,
                             dropped=g.dropped,
                             consumers=node.courier.consumers_of(g.topic, g.name) if leading else 0)
                for g in status.groups if sees(g.topic)],
        pending=[pb.TopicPending(topic=topic, pending=count)
                 for topic, count in sorted(status.pending.items()) if sees(topic)],
        pending_untracked=status.pending_untracked, shard=node.shards.shard,
        shards=shard_infos(node, node.leader_grpc(status.leader) or ""),
        map_version=node.shards.version, cluster_version=node.replica.upgrade.cluster_version)


_SPANS: dict[int, tuple[int, int, bool]] = {
    pb.SPAN_UNSPECIFIED: (1, 60, False), pb.SPAN_MINUTE: (1, 60, False),
    pb.SPAN_HOUR: (60, 60, False), pb.SPAN_DAY: (3_600, 24, True),
    pb.SPAN_YEAR: (86_400, 366, True)}
"""Per span: bucket seconds, buckets, and whether they start at the current hour (so that no
hour but the current one is cut by a bucket's edge) rather than the current second."""


def due_histogram(node: NodeContext, span: int, principal: Principal = ANYONE, topic: str = ""
                  ) -> pb.DueHistogramResponse:
    """The due-time histogram of ``span`` from this node's replica (of ``topic``'s messages
    alone, if given), with the pending totals of the topics ``principal`` has some grant on.
    An unknown span is the minute's. A topic that is not a topic's name is refused naming
    ``topic`` (`InvalidMessage`), one the principal has no grant on too (`PermissionDenied`)."""
    if topic:
        check_topic(topic, "topic", dead_letter=True)
        if not principal.sees(topic):
            raise PermissionDenied("topic", f"principal {principal.name!r} has no grant on "
                                   f"topic {topic!r}")
    bucket_s, buckets, by_hour = _SPANS.get(span, _SPANS[pb.SPAN_MINUTE])
    now_ms = node.clock.now_ms()
    start_second = now_ms // 1_000
    if by_hour:
        start_second -= start_second % 3_600
    counted = node.replica.due_histogram(start_second, bucket_s, buckets, topic or None)
    status = node.replica.status()
    return pb.DueHistogramResponse(
        now_ms=now_ms, start_ms=start_second * 1_000, bucket_ms=bucket_s * 1_000,
        counts=counted.counts, overdue=counted.overdue, beyond=counted.beyond,
        cursor_second=status.cursor.second,
        pending=[pb.TopicPending(topic=topic, pending=count)
                 for topic, count in sorted(status.pending.items()) if principal.sees(topic)],
        pending_untracked=status.pending_untracked, topic=topic)


def _clocks_and_disks(node: NodeContext, members: list[pb.Member]) -> None:
    """Each member's clock offset (the leader's estimates) and disk (the latest reports)."""
    offsets = node.replica.clock.observe()
    spaces = {space.member: space for space in node.disk.spaces()}
    for member in members:
        offset = offsets.get(member.raft_address)
        if offset is not None:
            member.clock_known = True
            member.clock_offset_ms, member.clock_error_ms = offset.offset_ms, offset.error_ms
        space = spaces.get(member.raft_address)
        if space is not None:
            member.disk_known = True
            member.free_bytes, member.reserve_bytes = space.free_bytes, space.reserve_bytes


def describe(node: NodeContext) -> pb.DescribeResponse:
    """This member as `Peer.Describe` tells the other members: its shard, its leader, its
    RocketMQ listener."""
    leader = node.leader_grpc(node.replica.leader_hint()) or ""
    return pb.DescribeResponse(shard=node.shards.shard, leader_grpc=leader,
                               rocketmq_address=node.rocketmq_address)


def shard_infos(node: NodeContext, leader_grpc: str) -> list[pb.Shard]:
    """Every shard, in a cluster of more than one: its members, and the leader of this
    node's own (the clients find the others' from the members they ask)."""
    shards = node.shards
    if shards.count == 1:
        return []
    return [pb.Shard(shard=index, grpc_addresses=members,
                     leader_grpc=leader_grpc if index == shards.shard else "")
            for index, members in enumerate(shards.members)]


def cursor_lag_ms(status: ReplicaStatus, now_ms: int) -> int:
    """On the leader, while due messages are out: how far the cursor trails the clock. An idle
    cursor waits in the second of the last message (it leaves a second only once a newer time
    stamp closes it), which is not lag."""
    if not status.dispatching or status.inflight_msgs == 0:
        return 0
    return max(0, now_ms - status.cursor.second * 1000)
