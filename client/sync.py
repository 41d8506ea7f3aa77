"""The blocking client.

::

    from tickwheel.client import Client

    with Client("127.0.0.1:7400") as client:
        result = client.schedule("orders", b"close #42", delay_ms=30 * 60_000,
                                 id="order-42-timeout")
        with client.consume("orders") as consumer:
            for message in consumer:
                handle(message.body)
                message.ack()
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

import grpc
from tenacity import Retrying

from tickwheel.client._core import (
    CHANNEL_OPTIONS,
    DEFAULT_TARGET,
    ClientBase,
    Received,
    receive_request,
    received,
    settle_request,
    stale_map,
    subscribe_request,
)
from tickwheel.client.coalescing import Coalescer
from tickwheel.client.consumers import Consumer
from tickwheel.client.credentials import Credentials, open_channel
from tickwheel.client.errors import TickwheelClientError, retryable, trailers, translate
from tickwheel.client.histogram import DueHistogram, due_histogram, histogram_request
from tickwheel.client.info import ClusterInfo, cluster_info
from tickwheel.client.messages import (
    CancelOutcome,
    Message,
    Rescheduled,
    Scheduled,
    cancel_outcomes,
    reschedule_request,
    reschedule_results,
    schedule_request,
    scheduled,
)
from tickwheel.client.receipts import ReceiptLog
from tickwheel.client.retries import retry_policy
from tickwheel.client.routing import Router, ShardRouters, receive_slices, split
from tickwheel.client.rpcs import (
    ACK_MESSAGES,
    CANCEL,
    CHANGE_INVISIBLE_DURATION,
    CLUSTER_INFO,
    CREATE_GROUP,
    DELETE_GROUP,
    DUE_HISTOGRAM,
    FINALIZE_UPGRADE,
    GROW_SHARDS,
    RECEIVE_MESSAGES,
    RESCHEDULE,
    SCHEDULE,
    RequestT,
    ResponseT,
    Unary,
)
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.v1 import tickwheel_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    # What a stream-stream call returns, as grpc's type stubs name it (no class at run time).
    from grpc import _CallIterator

log = logging.getLogger("tickwheel.client")
Answer = TypeVar("Answer")


class Client(ClientBase[grpc.Channel]):
    """Talks to a tickwheel cluster through any of ``targets`` (``host:port``, or a
    comma-separated list), and to the leader once it knows it. Every call is retried with
    jittered back-off on ``UNAVAILABLE`` and leader changes for up to ``timeout_s``.

    In a cluster of several shards it reads the shard map from the first node that answers,
    sends each message to its shard's leader (a request of messages of several shards is split
    and answered in its order), each handle and receipt to the shard that gave it out, and
    consumes from every shard at once."""

    def __init__(self, targets: str | Sequence[str] = DEFAULT_TARGET, *,
                 timeout_s: float = 30.0, attempt_timeout_s: float = 10.0,
                 credentials: Credentials | None = None) -> None:
        super().__init__(targets, timeout_s=timeout_s, attempt_timeout_s=attempt_timeout_s,
                         credentials=credentials)
        self._lock = threading.Lock()
        self._receive_turn = 0
        self._pool: ThreadPoolExecutor | None = None
        self._stubs: dict[str, pb_grpc.TickwheelStub] = {}
        """One per channel: a stub builds a callable for every method of the service."""
        self._coalescer = Coalescer(self.schedule_many)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()
            self._stubs.clear()

    def schedule(self, topic: str, body: bytes | str, *, deliver_at_ms: int | None = None,
                 delay_ms: int | None = None, delay_level: int | None = None,
                 id: str | None = None, properties: Mapping[str, str] | None = None,
                 routing_key: str = "") -> Scheduled:
        """Schedule one message; give exactly one of ``deliver_at_ms``, ``delay_ms`` and
        ``delay_level``. Calls from several threads at once share requests
        (`tickwheel.client.coalescing`); each gets its own message's answer."""
        message = Message(topic, body, deliver_at_ms, delay_ms, properties=properties or {},
                          delay_level=delay_level, routing_key=routing_key,
                          **({"id": id} if id else {}))
        return self._coalescer.schedule(message)

    def schedule_many(self, messages: Iterable[Message]) -> list[Scheduled]:
        """Schedule a batch in one request (one Raft entry, usually) per shard."""
        batch = list(messages)
        return self._per_shard(
            lambda shards: [shards.shard_of_message(m.routing_key, m.id) for m in batch],
            lambda shard, positions: scheduled(self._call(
                SCHEDULE, schedule_request(batch[p] for p in positions), shard=shard)))

    def cancel(self, handle: int) -> bool:
        """Whether the message is cancelled (by this call or an earlier one): it will not be
        delivered from now on. False means it was already delivered and acked."""
        return self.cancel_many([handle])[0]

    def cancel_many(self, handles: Sequence[int]) -> list[bool]:
        return [outcome.cancelled for outcome in self.cancel_outcomes(handles)]

    def cancel_outcomes(self, handles: Sequence[int]) -> list[CancelOutcome]:
        """Per handle, what the cancel did, telling a first cancel from a repeated one."""
        return self._per_shard(
            lambda shards: list(map(shards.shard_of_handle, handles)),
            lambda shard, positions: cancel_outcomes(self._call(
                CANCEL, pb.CancelRequest(handles=[handles[p] for p in positions]),
                shard=shard)))

    def reschedule(self, handles: Sequence[int], *, deliver_at_ms: int | None = None,
                   delay_ms: int | None = None) -> list[Rescheduled]:
        """Move pending messages to ``deliver_at_ms``, or ``delay_ms`` from now on the leader's
        clock (0: now); per handle, what that did. The handles stay valid. Safe to repeat."""
        reschedule_request([], deliver_at_ms, delay_ms)  # checks the times before any call
        return self._per_shard(
            lambda shards: list(map(shards.shard_of_handle, handles)),
            lambda shard, positions: reschedule_results(self._call(
                RESCHEDULE, reschedule_request([handles[p] for p in positions],
                                               deliver_at_ms, delay_ms), shard=shard)))

    def cluster_info(self, target: str | None = None) -> ClusterInfo:
        """What one node (``target``, else any) says about the cluster."""
        if target is None:
            return cluster_info(self._call(CLUSTER_INFO, pb.ClusterInfoRequest()))
        try:
            return cluster_info(self._stub(target).ClusterInfo(pb.ClusterInfoRequest(),
                                                               timeout=self._attempt_timeout_s))
        except grpc.RpcError as error:
            raise translate(error) from None

    def due_histogram(self, span: str = "minute", shard: int = 0, topic: str = ""
                      ) -> DueHistogram:
        """How many pending messages of ``shard`` are due in each bucket of ``span`` ("minute",
        "hour", "day" or "year"), every topic together or ``topic``'s alone, as a node of it
        counts them; with each topic's pending total the caller has a grant on
        (docs/console.md)."""
        return due_histogram(self._call(DUE_HISTOGRAM, histogram_request(span, topic),
                                        shard=shard), topic)

    def shards(self) -> ShardRouters:
        """The cluster's shards, read from the first node that answers (once)."""
        shards = self._shards
        if not shards.known:
            try:
                shards = self._learn(self._call(CLUSTER_INFO, pb.ClusterInfoRequest()))
            except TickwheelClientError as error:
                shards = self._unmapped(error)
        return shards

    def refresh_shards(self) -> ShardRouters:
        """Read the shard map again and take it if it is newer (shards were added)."""
        return self._learn(self._call(CLUSTER_INFO, pb.ClusterInfoRequest()))

    def consume(self, topic: str, *, prefetch: int = 64, visibility_timeout_ms: int = 0,
                name: str = "", group: str = "",
                receipts_dir: Path | str | None = None) -> Consumer:
        """Iterate over the due messages of ``topic`` as a consumer of ``group`` (created if
        new; "" is the topic's default group), competing with the group's other consumers:
        every group gets every message. ``prefetch`` messages may be on their way at once
        (shared among the shards, at least one from each). With ``receipts_dir``, each message
        is written down there as it is taken (`tickwheel.client.receipts`), for the audit."""
        receipts = None if receipts_dir is None else ReceiptLog(receipts_dir, name)
        return Consumer(self, subscribe_request(topic, prefetch, visibility_timeout_ms, name,
                                                group), prefetch, receipts)

    def receive(self, topic: str, *, consumer: str, group: str = "", max_messages: int = 16,
                invisible_duration_ms: int = 0, wait_ms: int = 5_000) -> list[Received]:
        """Receive without a stream: up to ``max_messages`` due messages, waiting up to
        ``wait_ms`` for the first. Each stays leased to you until acked (`Received.ack`, or
        `ack_receipts` from anywhere) or until ``invisible_duration_ms`` (0: the node's
        default) passes; then it comes back as a retry. Calls naming one ``consumer`` share
        it. With several shards, each call starts at the next shard and asks each in turn,
        waiting a slice of ``wait_ms`` at each (`receive_slices`)."""
        count = self.shards().count
        self._receive_turn += 1
        response = pb.ReceiveResponse()
        for shard, slice_ms in receive_slices(count, self._receive_turn, wait_ms):
            response = self._call(RECEIVE_MESSAGES, receive_request(
                topic, consumer, group, max_messages, invisible_duration_ms, slice_ms),
                timeout_s=slice_ms / 1000 + self._attempt_timeout_s, shard=shard)
            if response.messages:
                break

        def settle(kind: Literal["ack", "nack"], receipt: str) -> None:
            if kind == "ack":
                self.ack_receipts(topic, group, [receipt])
            else:
                self.change_invisible_duration(topic, group, [receipt], 0)
        return received(response, settle)

    def ack_receipts(self, topic: str, group: str, receipts: Sequence[str]) -> list[bool]:
        """Per receipt, whether it acked a current lease of the group."""
        return self._settle(ACK_MESSAGES, topic, group, receipts, 0)

    def change_invisible_duration(self, topic: str, group: str, receipts: Sequence[str],
                                  invisible_duration_ms: int) -> list[bool]:
        """Move the leases' deadlines to ``invisible_duration_ms`` from now (0: retry now);
        per receipt, whether it named a current lease of the group."""
        return self._settle(CHANGE_INVISIBLE_DURATION, topic, group, receipts,
                            invisible_duration_ms)

    def create_group(self, topic: str, group: str) -> bool:
        """Create a consumer group (messages coming due from now on wait for it), on every
        shard; whether it existed already (on every shard)."""
        request = pb.GroupRequest(topic=topic, group=group)
        return all([self._call(CREATE_GROUP, request, shard=shard).existed
                    for shard in range(self.shards().count)])

    def delete_group(self, topic: str, group: str) -> bool:
        """Delete a consumer group and what waits in it, on every shard; whether it existed
        (on any)."""
        request = pb.GroupRequest(topic=topic, group=group)
        return any([self._call(DELETE_GROUP, request, shard=shard).existed
                    for shard in range(self.shards().count)])

    def finalize_upgrade(self) -> int:
        """Have every shard of the cluster write this release's formats from now on
        (docs/replication.md#compatibility), shard by shard; returns the cluster version now
        in force. After it no member can go back to the release before. Refused
        (``FAILED_PRECONDITION``, naming the member) while a member runs an older release,
        the leader too (its ``UNIMPLEMENTED`` is said so). Takes an admin grant on every
        topic."""
        versions = []
        for shard in range(self.shards().count):
            try:
                versions.append(self._call(FINALIZE_UPGRADE, pb.FinalizeUpgradeRequest(),
                                           shard=shard).cluster_version)
            except TickwheelClientError as error:
                if error.code != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                leader = self._call(CLUSTER_INFO, pb.ClusterInfoRequest(), shard=shard).leader
                raise TickwheelClientError(grpc.StatusCode.FAILED_PRECONDITION, (
                    f"cluster_version: the leader of shard {shard}, member {leader}, runs a "
                    "release before cluster versions (0.0.4): upgrade it first")) from None
        return min(versions)

    def grow_shards(self, shards: Sequence[Sequence[str]],
                    peers: Sequence[Sequence[str]]) -> int:
        """Add ``shards`` (each its members' gRPC addresses, and ``peers`` their peer
        listeners, in the same order) to the running cluster, whose new shards' nodes already
        run with the new map (docs/shards.md#growing-a-running-cluster): copy every consumer
        group to them, then have each shard of the current map take the new one, in shard
        order; copy the groups created meanwhile. Returns the new map's version. Takes an admin
        grant on every topic."""
        current = self.refresh_shards()
        known = [router.targets for router in current.routers]
        wanted = [list(members) for members in shards]
        if len(known) > len(wanted) and known[-len(wanted):] == wanted:
            # a node answered with the new map already (a growth begun before, or a node of
            # a new shard): finish that growth
            count, version = len(known) - len(wanted), current.version
        else:
            count, version = len(known), current.version + 1
        request = pb.GrowShardsRequest(version=version, shards=[
            pb.NewShard(grpc_addresses=members, peer_addresses=listeners)
            for members, listeners in zip(shards, peers, strict=True)])
        added = [Router(members) for members in shards]
        self._copy_groups(count, added)
        for shard in range(count):
            answer = self._call(GROW_SHARDS, request, shard=shard)
            log.info("event=shard_grown shard=%d version=%d shards=%d", shard, answer.version,
                     answer.shards)
        self._copy_groups(count, added)
        return self.refresh_shards().version

    def _copy_groups(self, count: int, added: list[Router]) -> None:
        """Create every named consumer group of the first ``count`` shards on the shards of
        ``added``."""
        groups = sorted({(group.topic, group.group) for shard in range(count)
                         for group in self._call(CLUSTER_INFO, pb.ClusterInfoRequest(),
                                                 shard=shard).groups if group.group})
        for router in added:
            for topic, group in groups:
                self._call(CREATE_GROUP, pb.GroupRequest(topic=topic, group=group),
                           router=router)

    # -- plumbing -------------------------------------------------------------------------

    def _settle(self, rpc: Unary[pb.SettleRequest, pb.SettleResponse], topic: str,
                group: str, receipts: Sequence[str], invisible_duration_ms: int) -> list[bool]:
        return self._per_shard(
            lambda shards: list(map(shards.shard_of_receipt, receipts)),
            lambda shard, positions: list(self._call(rpc, settle_request(
                topic, group, [receipts[p] for p in positions], invisible_duration_ms),
                shard=shard).settled))

    def _per_shard(self, place: Callable[[ShardRouters], list[int]],
                   call: Callable[[int, list[int]], list[Answer]]) -> list[Answer]:
        """``call(shard, positions)`` for each shard's part of a request, whose items
        ``place`` puts on shards by the map, the answers merged in the request's order. A part
        a node refuses as another shard's (the map changed) is placed again by the map read
        anew, once; the parts answered keep their answers."""
        shards = self.shards()
        where = place(shards)
        if not where:  # nothing to place: the node answers what is wrong with the request
            return call(0, [])
        answers: dict[int, Answer] = {}
        todo = list(range(len(where)))
        for attempt in range(2):
            stale: list[int] = []
            parts = [(shard, [todo[i] for i in positions])
                     for shard, positions in split(where[p] for p in todo).items()]
            for (_, chosen), result in zip(parts, self._each(call, parts), strict=True):
                if isinstance(result, TickwheelClientError) and stale_map(result) and (
                        not attempt):
                    stale += chosen
                elif isinstance(result, BaseException):
                    raise result
                else:
                    answers.update(zip(chosen, result, strict=True))
            if not stale:
                break
            self._shards.known = False
            todo, where = stale, place(self.shards())
        return [answers[p] for p in range(len(where))]

    def _each(self, call: Callable[[int, list[int]], list[Answer]],
              parts: list[tuple[int, list[int]]]) -> list[list[Answer] | BaseException]:
        """``call`` of each part, its answer or what it raised; several parts at once, on a
        thread each (a pool kept while the client is open): a producer's batch over S shards
        takes one round trip, not S."""
        if len(parts) == 1:
            try:
                return [call(*parts[0])]
            except TickwheelClientError as error:
                return [error]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(thread_name_prefix="tickwheel-client-shard")
            pool = self._pool
        futures = [pool.submit(call, shard, chosen) for shard, chosen in parts]
        return [future.exception() or future.result() for future in futures]

    def _stub(self, address: str) -> pb_grpc.TickwheelStub:
        with self._lock:
            stub = self._stubs.get(address)
            if stub is None:
                channel = self._channels[address] = open_channel(
                    address, self._credentials, CHANNEL_OPTIONS)
                stub = self._stubs[address] = pb_grpc.TickwheelStub(channel)
        return stub

    def _call(self, rpc: Unary[RequestT, ResponseT], request: RequestT,
              timeout_s: float | None = None, shard: int = 0,
              router: Router | None = None) -> ResponseT:
        try:
            return Retrying(**retry_policy(self._timeout_s))(
                lambda: self._attempt(rpc, request, timeout_s, shard, router))
        except grpc.RpcError as error:
            raise translate(error) from None

    def _attempt(self, rpc: Unary[RequestT, ResponseT], request: RequestT,
                 timeout_s: float | None = None, shard: int = 0,
                 router: Router | None = None) -> ResponseT:
        """One try at ``shard``'s leader as its router knows it (or at ``router``'s)."""
        router = router or self._shards.routers[shard]
        address = router.choose()
        method: grpc.UnaryUnaryMultiCallable[RequestT, ResponseT] = getattr(
            self._stub(address), rpc.name)
        try:
            response, call = method.with_call(request,
                                              timeout=timeout_s or self._attempt_timeout_s)
        except grpc.RpcError as error:
            metadata = trailers(error)
            router.observe(metadata)
            if retryable(error):
                router.failed(address, metadata)
                log.debug("event=retry method=%s target=%s code=%s", rpc.name, address,
                          error.code().name)
            raise
        router.observe(call.trailing_metadata())
        return response

    def _open_stream(self, requests: Iterator[pb.ReceiveRequest], shard: int
                     ) -> tuple[str, _CallIterator[pb.ReceiveResponse]]:
        router = self._shards.routers[shard]
        if router.leader is None:
            self._learn_leader(shard)
        address = router.choose()
        return address, self._stub(address).Receive(requests)

    def _learn_leader(self, shard: int) -> None:
        """Ask a node who leads, once, before a stream opens while no answer has named the
        leader: a stream opened on a follower is proxied, a hop and the follower's CPU for every
        message. Best effort: if no node answers, the stream opens where the router says."""
        with contextlib.suppress(grpc.RpcError):
            self._attempt(CLUSTER_INFO, pb.ClusterInfoRequest(), shard=shard)

    def _route_failed(self, address: str, error: grpc.RpcError, shard: int) -> None:
        router = self._shards.routers[shard]
        metadata = trailers(error)
        router.observe(metadata)
        router.failed(address, metadata)
