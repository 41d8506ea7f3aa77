"""What `GrowShards` refuses before it proposes anything: shards that could not take part in
the map, and a map whose old shards the new ones could not ask about ids."""

from __future__ import annotations

import pytest

from tickwheel.common.errors import InvalidMessage, MapConflict
from tickwheel.node.api.growth import _check_added
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
