"""What `GrowShards` refuses before it proposes anything: shards that could not take part in
the map, and a map whose old shards the new ones could not ask about ids."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from tickwheel.common.errors import InvalidMessage, MapConflict
from tickwheel.node.api.growth import SKEW_MARGIN_MS, Predecessors, _check_added
from tickwheel.node.api.placement import ShardMap
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.wheel import NewMessage

CURRENT = ShardMap(0, (("a:7400",), ("b:7400",)), (("a:7600",), ("b:7600",)))


@pytest.mark.parametrize(("added", "field"), [
    ([], "shards"),
    ([([], [])], "shards[0].grpc_addresses"),
    ([(["c:7400"], [])], "shards[0].peer_addresses"),
    ([(["c:7400", "d:7400"], ["c:7600", ""])], "shards[0].peer_addresses"),
    ([(["c:7400"], ["c:7600"]), (["b:7400"], ["b:7600"])], "shards[1].grpc_addresses"),
    ([(["c:7400"], ["c:7600"]), (["c:7400"], ["c:7600"])], "shards[1].grpc_addresses"),
])
def test_shards_that_cannot_join_are_refused_naming_the_field(
        added: list[tuple[list[str], list[str]]], field: str) -> None:
    with pytest.raises(InvalidMessage) as refused:
        _check_added(CURRENT, added)
    assert refused.value.field == field


def test_a_map_without_the_old_shards_peer_listeners_cannot_grow() -> None:
    without = ShardMap(0, (("a:7400",), ("b:7400",)), (("a:7600",), ("",)))
    with pytest.raises(MapConflict, match="SHARD=GRPC=PEER"):
        _check_added(without, [(["c:7400"], ["c:7600"])])
    _check_added(CURRENT, [(["c:7400"], ["c:7600"])])  # with them, it may


def test_the_grown_map_survives_its_trip_through_the_log() -> None:
    grown = CURRENT.grown(2, [["c:7400"], ["d:7400"]], [["c:7600"], ["d:7600"]])
    assert (grown.count, grown.grown_from, grown.version) == (4, 2, 2)
    assert CURRENT.with_body(2, grown.body()) == grown
    # an id of a shard added was, before, on the shard jump hash gave it among two
    messages = [pb.Message(id=f"order-{n}") for n in range(200)]
    checked = [NewMessage(m.id, "orders", b"", 0) for m in messages]
    on_three = ShardMap(3, grown.members, grown.peers, 2, 2)
    owners = on_three.previous_owners(messages, checked)
    assert set(owners) <= {0, 1} and sum(map(len, owners.values())) == 200
    assert CURRENT.previous_owners(messages, checked) == {}


class _Peers:
    """`ShardPeers.remembered` as a previous owner answers it, counting the questions."""

    def __init__(self, changed_at_ms: int) -> None:
        self.changed_at_ms = changed_at_ms
        self.asked: list[list[str]] = []

    async def remembered(self, shard: int, ids: list[str], version: int,
                         budget_s: float) -> pb.RememberedResponse:
        self.asked.append(ids)
        return pb.RememberedResponse(map_version=version, changed_at_ms=self.changed_at_ms,
                                     found=[pb.RememberedId(index=0, handle=7)])


@pytest.mark.parametrize("changed_at_ms", [1_000_000, 0])
def test_a_shard_added_asks_the_previous_owner_for_its_window_then_no_more(
        changed_at_ms: int) -> None:
    """For the dedupe window (and a margin for clocks) after the previous owner took the map,
    or, if it has no stamp for it (started with that map), after its first answer."""
    clock = SimpleNamespace(ms=1_000_000)
    node = SimpleNamespace(clock=SimpleNamespace(now_ms=lambda: clock.ms),
                           replica=SimpleNamespace(dedupe_window_ms=600_000))
    peers = _Peers(changed_at_ms)
    predecessors = Predecessors(node, peers)  # type: ignore[arg-type]
    grown = CURRENT.grown(2, [["c:7400"]], [["c:7600"]])
    on_new = ShardMap(2, grown.members, grown.peers, 2, 2)
    messages = [pb.Message(id="order-1")]
    checked = [NewMessage("order-1", "orders", b"", 0)]

    def ask() -> dict[int, tuple[int, int]]:
        return asyncio.run(predecessors.remembered(on_new, messages, checked))
    assert ask() == {0: (7, 0)}
    clock.ms += 600_000 + SKEW_MARGIN_MS  # the window and the margin, to the ms
    ask()
    assert len(peers.asked) == 2
    clock.ms += 1
    assert ask() == {}  # past it: scheduled here as new, nobody asked
    assert len(peers.asked) == 2
