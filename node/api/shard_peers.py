"""The other shards of a cluster, reached through their members' peer listeners.

A node of one shard calls another shard as its followers call their leader: a forwarded call
(`tickwheel.node.api.forward`) to that shard's leader's peer listener, with the peer token and
the principal it serves, which the leader authorizes as its own callers (the shards share the
Raft secret). Which member leads is learned from the answers: a member that does not lead
refuses a forwarded call ``UNAVAILABLE`` and names its leader when it knows one, and the call
goes there, or to the next member.

`ShardPeers.rocketmq_routes` asks every member what it is (`Peer.Describe`), at most once a
`DESCRIBE_EVERY_S`, so that the RocketMQ listener's routes name each shard's leader.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
from google.protobuf.message import Message
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_random_exponential,
)

from tickwheel.common.errors import Retryable
from tickwheel.node.api.forward import LEADER_KEY, Forwarder, LeaderRefused, forwarded
from tickwheel.node.api.placement import ShardMap
from tickwheel.node.security.access import Principal
from tickwheel.node.security.identity import PeerCallers
from tickwheel.v1 import tickwheel_pb2 as pb

DESCRIBE_EVERY_S = 1.0
"""How old the members' descriptions a route names may be."""
DESCRIBE_TIMEOUT_S = 1.0
log = logging.getLogger("tickwheel.node.shards")
ResponseT = TypeVar("ResponseT", bound=Message)
T = TypeVar("T")


class _NotLeading(Exception):
    """The member asked does not lead its shard, or could not be reached."""


class _Behind(Exception):
    """No member of a shard that has applied the shard map asked for answered."""


class ShardPeers:
    """Calls to the leaders of the shards of ``shards`` (their members' peer listeners, which
    every entry of the map names), dialed through ``forwarder`` as ``callers`` proves
    membership. ``describe`` is this node's own `Peer.Describe` answer, ``own_grpc`` its gRPC
    address in the map."""

    def __init__(self, shards: Callable[[], ShardMap], forwarder: Forwarder,
                 callers: PeerCallers, describe: Callable[[], pb.DescribeResponse],
                 own_grpc: str) -> None:
        self._map = shards
        self._own_grpc = own_grpc
        self._forwarder = forwarder
        self._callers = callers
        self._describe = describe
        self._leader: dict[int, int] = {}
        """The member of each shard believed to lead (an index into its members)."""
        self._rocketmq: dict[str, str] = {}
        """gRPC address -> RocketMQ address, of each member that has answered."""
        self._routes: list[str] = []
        self._described_at = float("-inf")
        self._describing = asyncio.Lock()

    async def perform(self, shard: int, method: str, request: Message, principal: Principal,
                      answer: type[ResponseT], budget_s: float) -> ResponseT:
        """Unary ``method`` of `Tickwheel` on ``shard``'s leader as ``principal``, tried on its
        members until one leads or ``budget_s`` has passed (`Retryable` then). Raises
        `LeaderRefused` with a status the leader answered."""
        deadline = time.monotonic() + budget_s
        try:
            response = await _patiently(budget_s, _NotLeading, lambda: self._ask_leader(
                shard, method, request, principal, deadline))
        except _NotLeading as failed:
            raise Retryable(f"no leader of shard {shard} reachable from this node ({failed}); "
                            "retry") from None
        if not isinstance(response, answer):
            raise TypeError(f"{method} answered a {type(response).__name__}")
        return response

    async def _ask_leader(self, shard: int, method: str, request: Message,
                          principal: Principal, deadline: float) -> Message:
        """One try, at the member believed to lead; `_NotLeading` (and the next member, or
        the one it names, believed to lead) if it does not or cannot be reached."""
        index = self._leader.get(shard, 0)
        peers = self._map().peers[shard]
        try:
            response: Message = await getattr(
                self._forwarder.stub(peers[index]), method)(
                request, metadata=forwarded(self._callers, principal),
                timeout=max(0.05, deadline - time.monotonic()))
        except grpc.aio.AioRpcError as failed:
            if failed.code() != grpc.StatusCode.UNAVAILABLE:
                raise LeaderRefused.of(failed) from None
            hinted = self._hinted(shard, failed)
            self._leader[shard] = (hinted if hinted not in (None, index)
                                   else (index + 1) % len(peers))
            raise _NotLeading(failed.details() or "unavailable") from None
        return response

    async def remembered(self, shard: int, ids: list[str], version: int,
                         budget_s: float) -> pb.RememberedResponse:
        """Which of ``ids`` ``shard`` remembers scheduling, from the first of its members
        (the one believed to lead first) that has applied shard map ``version`` or a newer
        one: such a member takes none of them any more, so what it does not remember it
        never will. `Retryable` if none has within ``budget_s``."""
        deadline = time.monotonic() + budget_s
        try:
            return await _patiently(budget_s, _Behind, lambda: self._remembered_once(
                shard, ids, version, deadline))
        except _Behind as behind:
            raise Retryable(f"shard {shard}, where these ids were scheduled before shard map "
                            f"version {version}, has not taken that version yet ({behind}); "
                            "retry") from None

    async def _remembered_once(self, shard: int, ids: list[str], version: int,
                               deadline: float) -> pb.RememberedResponse:
        """Each member of ``shard`` in turn until one has applied ``version``; `_Behind`
        saying why none answered."""
        peers = self._map().peers[shard]
        first = self._leader.get(shard, 0)
        behind = "no member answered"
        for offset in range(len(peers)):
            peer = peers[(first + offset) % len(peers)]
            try:
                answer: pb.RememberedResponse = await self._forwarder.peer_stub(
                    peer).Remembered(pb.RememberedRequest(ids=ids),
                                     metadata=self._callers.metadata(),
                                     timeout=max(0.05, deadline - time.monotonic()))
            except grpc.aio.AioRpcError as failed:
                behind = f"{peer}: {failed.code().name} {failed.details()}"
                continue
            if answer.map_version >= version:
                return answer
            behind = f"{peer} has applied shard map version {answer.map_version}"
        raise _Behind(behind)

    async def rocketmq_routes(self) -> list[str]:
        """Each shard's RocketMQ address as a route names it: its leader's listener, else a
        member's that answered (a follower relays to its leader), else "" (none answered)."""
        async with self._describing:
            if time.monotonic() - self._described_at >= DESCRIBE_EVERY_S:
                await self._describe_all()
                self._described_at = time.monotonic()
        return list(self._routes)

    async def _describe_all(self) -> None:
        own = self._describe()
        self._rocketmq[self._own_grpc] = own.rocketmq_address
        shards = self._map()
        asked = [(shard, address, peer)
                 for shard, (members, peers) in enumerate(zip(shards.members,
                                                              shards.peers, strict=True))
                 for address, peer in zip(members, peers, strict=True)
                 if peer and address != self._own_grpc]
        answers = await asyncio.gather(*(self._ask(peer) for _, _, peer in asked))
        leaders: dict[int, str] = {}
        for (shard, address, _), answer in zip(asked, answers, strict=True):
            if answer is None:
                continue
            if answer.shard != shard:
                log.warning("event=shard_map_mismatch member=%s serves=%d listed_in=%d",
                            address, answer.shard, shard)
                continue
            if answer.rocketmq_address:
                self._rocketmq[address] = answer.rocketmq_address
            if answer.leader_grpc and (answer.leader_grpc == address or shard not in leaders):
                leaders[shard] = answer.leader_grpc
        if own.leader_grpc:
            leaders[shards.shard] = own.leader_grpc
        self._routes += [""] * (shards.count - len(self._routes))
        for shard, members in enumerate(shards.members):
            leader = leaders.get(shard)
            if leader in members:
                self._leader[shard] = members.index(leader)
            known = [self._rocketmq[m] for m in members if m in self._rocketmq]
            self._routes[shard] = self._rocketmq.get(leader or "", "") or (
                known[0] if known else self._routes[shard])

    async def _ask(self, peer: str) -> pb.DescribeResponse | None:
        try:
            response: pb.DescribeResponse = await self._forwarder.peer_stub(peer).Describe(
                pb.DescribeRequest(), metadata=self._callers.metadata(),
                timeout=DESCRIBE_TIMEOUT_S)
        except grpc.aio.AioRpcError:
            return None
        return response

    def _hinted(self, shard: int, failed: grpc.aio.AioRpcError) -> int | None:
        """The member a refusal names as its leader, if it is one of ``shard``'s."""
        members = self._map().members[shard]
        for key, value in failed.trailing_metadata() or ():
            if key == LEADER_KEY and value in members:
                return members.index(str(value))
        return None


async def _patiently(budget_s: float, again_on: type[Exception],
                     attempt: Callable[[], Awaitable[T]]) -> T:
    """``attempt()`` again, with jittered back-off, while it raises ``again_on`` and
    ``budget_s`` lasts (then the last ``again_on`` is raised)."""
    async for retrying in AsyncRetrying(retry=retry_if_exception_type(again_on), reraise=True,
                                        stop=stop_after_delay(budget_s),
                                        wait=wait_random_exponential(multiplier=0.02, max=0.5)):
        with retrying:
            return await attempt()
    raise AssertionError("not reached: the last attempt raises or returns")
