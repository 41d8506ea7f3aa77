"""``ClusterInfo``: the cluster as one node sees it, and how far its cursor trails."""

from __future__ import annotations

from tickwheel.node.api.context import NodeContext
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
                         role=status.role, connected=True)]
    for peer in status.peers:
        lag = max(0, status.commit_index - status.match_index[peer]) if (
            leading and peer in status.match_index) else 0
        role = "leader" if peer == status.leader else ("follower" if leading else "unknown")
        members.append(pb.Member(raft_address=peer, grpc_address=node.members[peer], role=role,
                                 connected=peer in status.connected, lag_entries=lag))
    topics = [pb.TopicInfo(topic=topic, ready=ready, unacked=unacked, consumers=consumers)
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
        map_version=node.shards.version)


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
