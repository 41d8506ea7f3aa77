"""Which shard a message, handle or receipt belongs to, as this node checks it: a node takes
only its own shard's (`tickwheel.client.shards` has the rules, shared with the clients)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tickwheel.client.shards import handle_shard, shard_of
from tickwheel.common.errors import ClientError, InvalidMessage, WrongShard
from tickwheel.replication import ShardMapRecord
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
    version: int = 1
    """1 for the map a cluster starts with; each growth adds 1."""
    grown_from: int = 0
    """How many shards the map had before the growth that made this version (0: none): an
    id this node takes may have been scheduled, within the dedupe window, on the shard it
    belonged to then."""

    @property
    def count(self) -> int:
        return len(self.members)

    def peers_known(self, shards: int | None = None) -> bool:
        """Whether every member of the first ``shards`` shards (every shard: None) has its
        peer listener address, through which members of other shards call it."""
        return all(all(peers) for peers in self.peers[:shards])

    def body(self) -> bytes:
        """The map as a ``shard_map`` command carries it (the shard is each node's own)."""
        return json.dumps({"members": self.members, "peers": self.peers,
                           "grown_from": self.grown_from}).encode()

    def with_body(self, version: int, body: bytes) -> ShardMap:
        """This node's map as ``version``, which ``body`` (what `body` made) describes."""
        described = json.loads(body)
        return replace(self, version=version,
                       members=tuple(tuple(m) for m in described["members"]),
                       peers=tuple(tuple(p) for p in described["peers"]),
                       grown_from=described["grown_from"])

    def grown(self, version: int, members: Sequence[Sequence[str]],
              peers: Sequence[Sequence[str]]) -> ShardMap:
        """This map with the shards ``members`` (and their ``peers``) added, as ``version``."""
        return replace(self, version=version, grown_from=self.count,
                       members=self.members + tuple(tuple(m) for m in members),
                       peers=self.peers + tuple(tuple(p) for p in peers))

    def previous_owners(self, requested: Sequence[pb.Message],
                        checked: Sequence[NewMessage]) -> dict[int, list[int]]:
        """The messages (by index) whose key belonged to another shard before the last growth,
        by that shard: where a retry of their id may have been scheduled. Empty for a shard
        that was in the map before (jump hash moves keys only to the shards added)."""
        if not self.grown_from or self.shard < self.grown_from:
            return {}
        owners: dict[int, list[int]] = {}
        for index, (message, new) in enumerate(zip(requested, checked, strict=True)):
            if not message.id:  # an id the node made up: never scheduled before
                continue
            owner = shard_of(message.routing_key or new.id, self.grown_from)
            owners.setdefault(owner, []).append(index)
        return owners

    def place(self, requested: Sequence[pb.Message], checked: list[NewMessage]) -> None:
        """Check that every message of a `Schedule` request is this shard's, by its routing
        key or id; a message sent without an id was given a random one (`validation`), now
        one of this shard. Raises `WrongShard` naming the first message of another: the
        whole request is refused (docs/shards.md), this shard's messages in it too."""
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


class LiveShardMap:
    """The map this node takes messages by: the one it started with, or a newer one its
    shard's log set (`GrowShards`), whichever is the newer version."""

    def __init__(self, started: ShardMap, record: Callable[[], ShardMapRecord | None]) -> None:
        self._started = started
        self._record = record
        self._current = started

    def current(self) -> ShardMap:
        record = self._record()
        if record is None or record.version <= self._started.version:
            return self._started
        if record.version != self._current.version:
            self._current = self._started.with_body(record.version, record.body)
        return self._current

    def changed_at_ms(self) -> int:
        """When this shard began to take messages by its current map: the stamp of the
        command that set it (kept when the node is restarted with that map given); 0 if no
        command did."""
        record = self._record()
        return 0 if record is None or record.version < self._started.version else (
            record.stamp_ms)


def refused_handle(field: str, handle: int, shard: int) -> ClientError:
    """The error for a handle this shard's cipher does not take: another shard's, or none."""
    owner = handle_shard(handle)
    if owner != shard:
        return WrongShard(field, f"is a handle of shard {owner}, not of this node's shard "
                          f"{shard}: send it there")
    return InvalidMessage(field, "is not a handle this cluster issued")
