"""Growing a running cluster: shards added to the map without a restart (docs/shards.md).

A shard takes messages by the newest map its log has applied (`GrowShards` proposes one) or
the one it started with. Jump hash moves keys only to the shards added, so a shard that was in
the map before only stops taking the keys that moved; a shard added takes them, and for as long
as the previous owner may remember an id (its dedupe window, from the moment that shard
changed its map) it asks that shard whether it scheduled the id, and answers a retry as the
message already stored there (`Predecessors`). The previous owner answers only once it has
applied the new map: from then on it takes none of those ids, so an id it does not remember
is new for good.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tickwheel.client.shards import MAX_SHARDS
from tickwheel.common.errors import InvalidMessage, MapConflict, PermissionDenied
from tickwheel.node.api.commits import applied
from tickwheel.node.api.context import NodeContext
from tickwheel.node.api.placement import ShardMap
from tickwheel.node.api.shard_peers import ShardPeers
from tickwheel.node.security.access import Action, Principal
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.wheel import NewMessage

SKEW_MARGIN_MS = 60_000
"""How much longer than the dedupe window a shard added asks the previous owners: their
stamps are their leaders' clocks, not this node's."""
LOOKUP_BUDGET_S = 5.0
"""How long a schedule waits for a previous owner to answer before it is refused
``UNAVAILABLE`` (retry)."""


class Predecessors:
    """What the shards that owned this shard's keys before the last growth remember."""

    def __init__(self, node: NodeContext, peers: ShardPeers) -> None:
        self._node = node
        self._peers = peers
        self._asked_until_ms: dict[tuple[int, int], int] = {}
        """(map version, previous owner) -> until when it may remember an id of ours."""

    async def remembered(self, shards: ShardMap, requested: Sequence[pb.Message],
                         checked: Sequence[NewMessage]) -> dict[int, tuple[int, int]]:
        """The messages (by index) whose id a previous owner scheduled within its window:
        ``(handle, deliver_at_ms)`` it answered (the handle as its clients see it)."""
        owners = shards.previous_owners(requested, checked)
        if not owners:
            return {}
        now_ms = self._node.clock.now_ms()
        asked = [(owner, indexes) for owner, indexes in owners.items()
                 if now_ms <= self._asked_until_ms.get((shards.version, owner), now_ms)]
        answers = await asyncio.gather(*(
            self._peers.remembered(owner, [checked[i].id for i in indexes], shards.version,
                                   LOOKUP_BUDGET_S) for owner, indexes in asked))
        found: dict[int, tuple[int, int]] = {}
        window_ms = self._node.replica.dedupe_window_ms + SKEW_MARGIN_MS
        for (owner, indexes), answer in zip(asked, answers, strict=True):
            key = (shards.version, owner)
            if answer.changed_at_ms:
                self._asked_until_ms[key] = answer.changed_at_ms + window_ms
            else:  # started with the new map, no command set it: a window from its first answer
                self._asked_until_ms.setdefault(key, now_ms + window_ms)
            for item in answer.found:
                found[indexes[item.index]] = item.handle, item.deliver_at_ms
        return found


def remembered(node: NodeContext, request: pb.RememberedRequest) -> pb.RememberedResponse:
    """`Peer.Remembered`: the map first, then the window, so every id scheduled before that
    map is in what is read."""
    version, changed_at_ms = node.shards.version, node.shard_map.changed_at_ms()
    found = node.replica.remembered(list(request.ids))
    handles = node.replica.handle_cipher().encode([handle for handle, _ in found.values()])
    return pb.RememberedResponse(
        map_version=version, changed_at_ms=changed_at_ms,
        found=[pb.RememberedId(index=index, handle=handle, deliver_at_ms=due_ms)
               for (index, (_, due_ms)), handle in zip(found.items(), handles, strict=True)])


async def grow_shards(node: NodeContext, request: pb.GrowShardsRequest,
                      principal: Principal) -> pb.GrowShardsResponse:
    """`GrowShards` on this shard's leader: propose the map with the shards added, and
    answer once it applied."""
    if not principal.unlimited(Action.ADMIN):
        raise PermissionDenied("shards", f"principal {principal.name!r} may not change the "
                               "shard map: that takes an admin grant on every topic")
    current = node.shards
    added = [(list(shard.grpc_addresses), list(shard.peer_addresses))
             for shard in request.shards]
    if request.version == current.version and current.grown_from and (
            [list(m) for m in current.members[current.grown_from:]] == [m for m, _ in added]):
        return pb.GrowShardsResponse(version=current.version, shards=current.count)
    if request.version != current.version + 1:
        raise MapConflict("version", f"is {request.version}, but shard {current.shard} takes "
                          f"messages by shard map version {current.version}: a growth makes "
                          f"version {current.version + 1}")
    _check_added(current, added)
    changed_at_ms = node.shard_map.changed_at_ms()
    window_ms = node.replica.dedupe_window_ms
    if changed_at_ms and node.clock.now_ms() < changed_at_ms + window_ms:
        raise MapConflict("version", f"shard {current.shard} took map version "
                          f"{current.version} less than the dedupe window ({window_ms} ms) "
                          f"ago: grow again from {changed_at_ms + window_ms} (Unix ms), so "
                          "that a retried id is looked up where it may have been scheduled")
    grown = current.grown(request.version, [m for m, _ in added], [p for _, p in added])
    version = await applied(node.replica.change_shard_map(grown.version, grown.body()))
    return pb.GrowShardsResponse(version=version, shards=node.shards.count)


def _check_added(current: ShardMap, added: list[tuple[list[str], list[str]]]) -> None:
    if not added:
        raise InvalidMessage("shards", "is empty: name the shards to add")
    if not current.peers_known():
        raise MapConflict("shards", f"shard {current.shard}'s map lacks peer listener "
                          "addresses of some members: the shards added ask the old ones "
                          "about ids through them. Give every shard_member as "
                          "SHARD=GRPC=PEER first")
    if current.count + len(added) > MAX_SHARDS:
        raise InvalidMessage("shards", f"would make {current.count + len(added)} shards, at "
                             f"most {MAX_SHARDS}")
    known = {address for members in current.members for address in members}
    for index, (members, peers) in enumerate(added):
        field = f"shards[{index}]"
        if not members:
            raise InvalidMessage(f"{field}.grpc_addresses", "is empty")
        if len(peers) != len(members) or not all(peers):
            raise InvalidMessage(f"{field}.peer_addresses", "must name each member's peer "
                                 "listener, in the order of grpc_addresses")
        for address in members:
            if address in known:
                raise InvalidMessage(f"{field}.grpc_addresses", f"names {address}, which "
                                     "is a member of another shard already")
            known.add(address)
