"""A node's place in a cluster of several shards: which shard it serves, and every shard's
members (docs/shards.md).

Each shard is an independent Raft group; a node serves one replica of one shard. Its own
shard's members are ``members``; the others' are ``shard_member`` entries,
``SHARD=GRPC[=PEER]`` (the gRPC address of one member of shard SHARD, and its peer listener's),
so that every node serves the whole map in ``ClusterInfo`` and clients route a message to its
shard without asking anyone else. The peer addresses let a node call another shard for its
callers: its RocketMQ listener sends a message to the shard its id belongs to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from pydantic import BaseModel, Field
from pydantic_settings import NoDecode

from tickwheel.client.shards import MAX_SHARDS
from tickwheel.node.api.placement import ShardMap


class ShardFields(BaseModel):
    """Which shard a node serves, and where the other shards are."""

    shard: int = 0
    """The shard this node's Raft group is: 0 to the number of shards less one. Every member
    of a group has the same one."""
    shard_members: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """``SHARD=GRPC[=PEER]`` for every member of every other shard (its gRPC address, and its
    peer listener's: needed with ``rocketmq_listen``); empty: the cluster is this node's shard
    alone. Entries of this node's own shard may be given too
    (they must then be its members' gRPC addresses), so every node can be given one list. A
    StatefulSet pod given ``shards`` derives it (`tickwheel.node.settings.statefulset`)."""
    shards: int | None = None
    """How many shards the cluster has; the map (``shard`` and ``shard_members``) must have
    as many. A StatefulSet pod derives ``shard_members`` from it, unless they are given.
    None: whatever the map has."""
    shard_map_version: int = Field(default=1, ge=1)
    """The version of that map: 1 for a cluster's first; each growth adds 1 (a shard's log
    keeps the newest it was given by ``GrowShards``, which wins over an older one here)."""
    grown_from: int = Field(default=0, ge=0)
    """How many shards the map had before the growth that made this version; 0: none. A
    shard added by a growth asks an id's previous shard whether it scheduled it."""


def shard_member(entry: str) -> tuple[int, str, str]:
    """A ``SHARD=GRPC[=PEER]`` entry as its shard, gRPC address and peer address ("" if not
    given); `ValueError` if it is neither form."""
    number, sep, addresses = entry.partition("=")
    address, _, peer = addresses.partition("=")
    if not sep or not number.strip().isdigit() or not address.strip() or "=" in peer:
        raise ValueError(f"shard_members entry {entry!r} is not SHARD=GRPC_ADDRESS or "
                         "SHARD=GRPC_ADDRESS=PEER_ADDRESS")
    return int(number), address.strip(), peer.strip()


def shard_map(shard: int, entries: Sequence[str], own_grpc: Sequence[str],
              shards: int | None = None, own_peers: Sequence[str] = (), version: int = 1,
              grown_from: int = 0) -> ShardMap:
    """The map from ``shard_members`` entries and the own shard's members' gRPC addresses
    (``own_grpc``) and peer listeners' (``own_peers``, in the same order, if known), of
    ``shards`` shards if that is given; `ValueError` saying what is wrong with them."""
    if not 0 <= shard < MAX_SHARDS:
        raise ValueError(f"shard {shard} is not 0 to {MAX_SHARDS - 1}")
    if shards is not None and not 1 <= shards <= MAX_SHARDS:
        raise ValueError(f"shards must be 1 to {MAX_SHARDS}, not {shards}")
    listed: dict[int, list[str]] = {}
    peers: dict[str, str] = dict(zip(own_grpc, own_peers, strict=False))
    for entry in entries:
        number, address, peer = shard_member(entry)
        listed.setdefault(number, []).append(address)
        if peer and number != shard:
            peers[address] = peer
    if shard in listed and sorted(listed[shard]) != sorted(own_grpc):
        raise ValueError(f"shard_members lists {sorted(listed[shard])} for this node's shard "
                         f"{shard}, whose members' gRPC addresses are {sorted(own_grpc)}")
    listed[shard] = list(own_grpc)
    count = max(listed) + 1
    if count > MAX_SHARDS:
        raise ValueError(f"shard_members names shard {count - 1}: at most {MAX_SHARDS} shards")
    missing = [index for index in range(count) if index not in listed]
    if missing:
        raise ValueError(f"shard_members names shard {count - 1} but no member of shard "
                         f"{missing[0]}: shards are numbered from 0 without gaps")
    seen: dict[str, int] = {}
    for index in range(count):
        for address in listed[index]:
            if seen.setdefault(address, index) != index:
                raise ValueError(f"{address} is listed in shards {seen[address]} and {index}: "
                                 "a node serves one shard")
    if shards is not None and count != shards:
        raise ValueError(f"shards is {shards}, but shard {shard} and shard_members make a map "
                         f"of {count} shard{'s' if count > 1 else ''}: give every member of "
                         f"shards 0..{shards - 1}")
    _check_growth(count, version, grown_from)
    return ShardMap(shard, tuple(tuple(listed[index]) for index in range(count)),
                    tuple(tuple(peers.get(address, "") for address in listed[index])
                          for index in range(count)), version, grown_from)


def _check_growth(count: int, version: int, grown_from: int) -> None:
    if grown_from and not (1 <= grown_from < count and version > 1):
        raise ValueError(f"grown_from is {grown_from}: a map of version {version} and {count} "
                         f"shards grew from 1 to {count - 1} shards, and only a version above "
                         "1 grew")


def preferred_leader(members: Sequence[str], shard: int, shards: int) -> str | None:
    """The member (of ``members``, Raft addresses in their given order) that leads ``shard``
    at rest: its (shard mod members)-th, so that the leaders of shards 0, 1, 2, ... sit on
    members 0, 1, 2, ... and, where member i of every shard runs on host i, no host leads
    two shards while another leads none (docs/shards.md). None in a cluster of one shard:
    whoever wins the election leads, and nothing hands over."""
    if shards <= 1 or not members:
        return None
    return members[shard % len(members)]
