"""Which node a client calls: the leader once an answer named it, else the targets in turn,
passing over a node that just failed; in a cluster of several shards, a router per shard, and
which shard each message, handle and receipt goes to."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence

from tickwheel.client.shards import handle_shard, receipt_shard, shard_of

LEADER_KEY = "tickwheel-leader"
"""The trailing metadata key of a node's answer that names the leader's gRPC address."""

FAILED_COOLDOWN_S = 1.0
"""How long a node that did not answer is passed over, unless every node failed: a paused
leader's followers name it as leader until their election ends, and a new connection to a
stopped process waits in its handshake (up to the channel's connect timeout) instead of
failing. A node that answered with a refusal (no leader yet, not the leader any more) is alive
and is not passed over: it may know the leader on the next try."""


class Router:
    """Which node to call: the leader, once a response has named it; else the given targets in
    turn. A failed call moves on to the next target, and the node that failed is passed over
    (and not taken as leader from a hint) for `FAILED_COOLDOWN_S`."""

    def __init__(self, targets: str | Sequence[str],
                 clock_s: Callable[[], float] = time.monotonic) -> None:
        listed = [targets] if isinstance(targets, str) else list(targets)
        self.targets = [t.strip() for item in listed for t in item.split(",") if t.strip()]
        if not self.targets:
            raise ValueError("no target address given")
        self._next = random.randrange(len(self.targets))
        self._clock_s = clock_s
        self._failed_s: dict[str, float] = {}
        self.leader: str | None = None

    def choose(self) -> str:
        if self.leader:
            return self.leader
        for _ in self.targets:
            target = self.targets[self._next % len(self.targets)]
            if not self._cooling(target):
                return target
            self._next += 1
        return self.targets[self._next % len(self.targets)]

    def observe(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> None:
        """Remember the leader a response named."""
        for key, value in metadata or ():
            if (key == LEADER_KEY and value and isinstance(value, str)
                    and not self._cooling(value)):
                self.leader = value

    def failed(self, address: str,
               trailers: Iterable[tuple[str, str | bytes]] | None = None) -> None:
        """A call to ``address`` failed, with these ``trailers``: a node that answered it with a
        refusal of its own (`answered`) is not passed over; a broken or unanswered connection
        is."""
        if not answered(trailers):
            self._failed_s[address] = self._clock_s()
        if self.leader == address:
            self.leader = None
        else:
            self._next += 1

    def _cooling(self, address: str) -> bool:
        failed_s = self._failed_s.get(address)
        return failed_s is not None and self._clock_s() - failed_s < FAILED_COOLDOWN_S


def answered(metadata: Iterable[tuple[str, str | bytes]] | None) -> bool:
    """Whether a failed call's trailers are a node's answer (they carry `LEADER_KEY`)."""
    return any(key == LEADER_KEY for key, _ in metadata or ())


class ShardRouters:
    """A `Router` per shard of the cluster. Until the shard map is read (`learn`, from a
    ``ClusterInfo`` answer) there is one, over the targets the client was given; a cluster of
    one shard keeps it."""

    def __init__(self, targets: str | Sequence[str],
                 clock_s: Callable[[], float] = time.monotonic) -> None:
        self._clock_s = clock_s
        self.routers = [Router(targets, clock_s)]
        self.known = False
        """Whether the map was read."""
        self.version = 0
        """The version of the map read (1 until the cluster grows)."""

    @property
    def count(self) -> int:
        return len(self.routers)

    def learn(self, shards: Sequence[tuple[Sequence[str], str]], version: int = 1) -> None:
        """Take the map of ``version``: per shard, its members' gRPC addresses and its
        leader's ("" if the answering node did not know it); none: the cluster is one shard.
        A map no newer than the one known is not taken (a node that has not taken a growth
        yet answers an older one), so the routers keep the leaders they found."""
        if self.known and version <= self.version:
            return
        self.version = version
        if shards:
            routers = []
            for members, leader in shards:
                router = Router(members, self._clock_s)
                router.leader = leader or None
                routers.append(router)
            self.routers = routers
        self.known = True

    def shard_of_message(self, routing_key: str, message_id: str) -> int:
        return shard_of(routing_key or message_id, self.count)

    def shard_of_handle(self, handle: int) -> int:
        """A handle's shard, or 0 for a number of no shard here (shard 0 then refuses it)."""
        shard = handle_shard(handle)
        return shard if shard < self.count else 0

    def shard_of_receipt(self, receipt: str) -> int:
        shard = receipt_shard(receipt)
        return shard if shard < self.count else 0


def split(shards: Iterable[int]) -> dict[int, list[int]]:
    """The positions of a request's items by the shard of each (in ``shards``' order)."""
    positions: dict[int, list[int]] = {}
    for position, shard in enumerate(shards):
        positions.setdefault(shard, []).append(position)
    return positions


RECEIVE_SLICE_MS = 500
"""How long one shard is waited on in a `receive` of a cluster of several shards, at most."""


def receive_slices(shards: int, turn: int, wait_ms: int) -> list[tuple[int, int]]:
    """Which shard to ask, and how long to wait there, in turn, for a ``receive`` without a
    stream: every shard at once, starting at shard ``turn`` (so that calls in a row start at
    each in turn), without waiting; then in turn again, waiting a slice of at most
    `RECEIVE_SLICE_MS` at each, until ``wait_ms`` is spent. One shard: itself, ``wait_ms``."""
    if shards == 1:
        return [(0, wait_ms)]
    order = [(turn + offset) % shards for offset in range(shards)]
    slices = [(shard, 0) for shard in order]
    slice_ms = min(RECEIVE_SLICE_MS, max(1, wait_ms // shards))
    left_ms, position = wait_ms, 0
    while left_ms > 0:
        waited = min(slice_ms, left_ms)
        slices.append((order[position % shards], waited))
        left_ms -= waited
        position += 1
    return slices
