"""Which shard a message, handle or receipt belongs to, as this node checks it: a node takes
only its own shard's (`tickwheel.client.shards` has the rules, shared with the clients)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from tickwheel.client.shards import handle_shard, shard_of
from tickwheel.common.errors import ClientError, InvalidMessage, WrongShard
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.wheel import NewMessage


@dataclass(frozen=True, slots=True)
class ShardMap:
    """Every shard's members' gRPC addresses, in shard order (one entry in a cluster of one
    shard), and the shard of this node."""

    shard: int
    members: tuple[tuple[str, ...], ...]
    peers: tuple[tuple[str, ...], ...] = ()
    """Each member's peer listener address, as ``members`` orders them ("" where not known)."""

    @property
    def count(self) -> int:
        return len(self.members)

    def place(self, requested: Sequence[pb.Message], checked: list[NewMessage]) -> None:
        """Check that every message of a `Schedule` request is this shard's, by its routing
        key or id; a message sent without an id was given a random one (`validation`), now
        one of this shard. Raises `WrongShard` naming the first message of another."""
        count, shard = self.count, self.shard
        if count == 1:
            return
        for index, (message, new) in enumerate(zip(requested, checked, strict=True)):
            key = message.routing_key or message.id
            if not key:
                new_id = new.id
                while shard_of(new_id, count) != shard:
                    new_id = uuid.uuid4().hex
                checked[index] = new._replace(id=new_id)
                continue
            owner = shard_of(key, count)
            if owner != shard:
                what = "routing_key" if message.routing_key else "id"
                raise WrongShard(f"messages[{index}].{what}",
                                 f"{key[:80]!r} belongs to shard {owner} of {count}, not to "
                                 f"this node's shard {shard}: schedule it there")


def refused_handle(field: str, handle: int, shard: int) -> ClientError:
    """The error for a handle this shard's cipher does not take: another shard's, or none."""
    owner = handle_shard(handle)
    if owner != shard:
        return WrongShard(field, f"is a handle of shard {owner}, not of this node's shard "
                          f"{shard}: send it there")
    return InvalidMessage(field, "is not a handle this cluster issued")
