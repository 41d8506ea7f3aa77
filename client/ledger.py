"""Every node's ledger, read over the ``Ledger`` service (`proto/tickwheel/v1/ledger.proto`):
its closed segments, and one message's life merged from every node.

`LedgerClient` finds every member of every shard from any node's ``ClusterInfo`` and calls
each one directly: a node answers for its own ledger alone, and the calls take an admin grant
on every topic (``PermissionDenied`` otherwise). `LedgerClient.trace` asks every node at once
and merges what they answer into `TracedEvent` rows: a committed event (every replica records
it) is one row naming the nodes that hold it; a send is one row per sending node.
`tickwheel.client.ledger_fetch` copies the segments to a folder. Used by ``tickwheel ledger
fetch`` and ``tickwheel trace`` (`tickwheel.node.cli.ledger`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import Final

import grpc

from tickwheel.client._core import CHANNEL_OPTIONS
from tickwheel.client.credentials import Credentials, open_channel
from tickwheel.client.errors import InvalidArgument, TickwheelClientError, translate
from tickwheel.client.rpcs import RequestT, ResponseT
from tickwheel.client.shards import handle_shard
from tickwheel.client.sync import Client
from tickwheel.v1 import ledger_pb2 as pb
from tickwheel.v1 import ledger_pb2_grpc as pb_grpc

OWN_EVENTS: Final = frozenset({"sent", "dispatch_started"})
"""A node's own rows; every other event is committed, and every replica records it."""


@dataclass(frozen=True, slots=True)
class Node:
    """A member of the cluster, as the ledger calls reach it."""

    shard: int
    grpc_address: str


@dataclass(frozen=True, slots=True)
class Segment:
    """One closed segment of a node's ledger, as its manifest describes it."""

    shard: int
    node: str
    """The node's Raft address."""
    sequence: int
    name: str
    manifest_json: str
    bytes: int
    sha256: str
    first_ms: int
    last_ms: int
    rows: int


@dataclass(frozen=True, slots=True)
class TracedEvent:
    """One step of a message's life (docs/node.md: the ledger's columns)."""

    event: str
    time_ms: int
    nodes: tuple[str, ...]
    """The nodes whose ledgers hold it (the sender alone for ``sent``)."""
    handle: int | None = None
    new_handle: int | None = None
    id: str | None = None
    topic: str | None = None
    group: str | None = None
    consumer: str | None = None
    lease: int | None = None
    possible_duplicate: bool | None = None
    attempt: int | None = None
    deliver_at_ms: int | None = None
    old_deliver_at_ms: int | None = None
    deadline_ms: int | None = None
    term: int | None = None
    epoch: int | None = None
    principal: str | None = None
    """Who scheduled, cancelled or rescheduled it (``""``: nobody named; None: another
    event, or a ledger written before the column)."""


@dataclass(frozen=True, slots=True)
class Trace:
    """A message's life from every node's ledger."""

    id: str
    events: list[TracedEvent]
    """By time, oldest first; empty if no ledger holds the id."""
    nodes: list[str] = field(default_factory=list)
    """The nodes that answered (Raft addresses)."""
    missed: list[tuple[Node, str]] = field(default_factory=list)
    """The nodes that did not, each with why."""
    truncated: bool = False
    """A node left rows out (past 10,000)."""


_DETAILS: Final = tuple(f.name for f in fields(TracedEvent) if f.name not in
                        ("event", "time_ms", "nodes"))


class LedgerClient:
    """Every node's ledger through ``targets`` (any nodes of the cluster), as the principal
    ``credentials`` name."""

    def __init__(self, targets: str | Sequence[str], *, credentials: Credentials | None = None,
                 timeout_s: float = 30.0) -> None:
        self._targets = targets
        self._credentials = credentials or Credentials.from_env()
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}

    def __enter__(self) -> LedgerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()

    def nodes(self) -> list[Node]:
        """Every member of every shard, as a node of the cluster knows them."""
        with Client(self._targets, credentials=self._credentials,
                    timeout_s=self._timeout_s) as client:
            info = client.cluster_info()
        if info.shards:
            return [Node(shard.shard, address) for shard in info.shards
                    for address in shard.grpc_addresses]
        return [Node(info.shard, member.grpc_address) for member in info.members]

    def segments(self, node: Node, since_ms: int = 0, until_ms: int = 0, *,
                 close_open: bool = False) -> tuple[str, list[Segment]]:
        """``node``'s Raft address, and its closed segments overlapping ``[since_ms,
        until_ms]`` (0: unbounded), oldest first (``close_open``: the node closes its open
        segment first, so that its last rows are listed too)."""
        found: list[Segment] = []
        after = 0
        while True:
            answer = self._unary(self._stub(node).ListLedgerSegments,
                                 pb.ListLedgerSegmentsRequest(
                                     since_ms=since_ms, until_ms=until_ms, after_sequence=after,
                                     close_open=close_open and after == 0))
            found += [Segment(answer.shard, answer.node, s.sequence, s.name, s.manifest_json,
                              s.bytes, s.sha256, s.first_ms, s.last_ms, s.rows)
                      for s in answer.segments]
            if not answer.more or not answer.segments:
                return answer.node, found
            after = answer.segments[-1].sequence

    def read(self, node: Node, sequence: int) -> Iterator[bytes]:
        """The bytes of ``node``'s segment ``sequence``, chunk by chunk."""
        call = self._stub(node).ReadLedgerSegment(
            pb.ReadLedgerSegmentRequest(sequence=sequence), timeout=self._timeout_s * 10)
        try:
            for chunk in call:
                yield chunk.data
        except grpc.RpcError as error:
            raise translate(error) from None
        finally:
            call.cancel()

    def trace(self, message_id: str, *, close_open: bool = False,
              nodes: list[Node] | None = None) -> Trace:
        """``message_id``'s life from every node's ledger (``close_open``: each node closes
        its open segment first, so that its last rows are searched too)."""
        nodes = self.nodes() if nodes is None else nodes
        return self._trace(pb.TraceMessageRequest(id=message_id, close_open=close_open),
                           nodes, message_id)

    def trace_handle(self, handle: int, *, close_open: bool = False,
                     nodes: list[Node] | None = None) -> Trace:
        """The life of the message ``handle`` names (a handle ``schedule`` returned), from
        the ledgers of its shard's nodes: the rows of the id the rows naming it carry.
        `InvalidArgument` (``handle``) for a number that is no handle."""
        if not 0 <= handle < 1 << 63:
            raise InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"handle: {handle} is no handle (0 to 2^63 - 1)")
        shard = handle_shard(handle)
        nodes = [n for n in (self.nodes() if nodes is None else nodes) if n.shard == shard]
        found = self._trace(pb.TraceMessageRequest(handle=handle, close_open=close_open),
                            nodes, "")
        named = next((e.id for e in found.events if e.id), "")
        return Trace(named, found.events, found.nodes, found.missed, found.truncated)

    def _trace(self, request: pb.TraceMessageRequest, nodes: list[Node], message_id: str
               ) -> Trace:
        """Ask ``nodes`` at once and merge their rows; a refusal of the request itself
        (``PERMISSION_DENIED``, ``INVALID_ARGUMENT``) is raised, other failures noted."""
        with ThreadPoolExecutor(max_workers=max(1, len(nodes)),
                                thread_name_prefix="tickwheel-trace") as pool:
            futures = [(node, pool.submit(self._unary, self._stub(node).TraceMessage,
                                          request)) for node in nodes]
        answers: list[pb.TraceMessageResponse] = []
        missed: list[tuple[Node, str]] = []
        for node, future in futures:
            error = future.exception()
            if isinstance(error, TickwheelClientError):
                if error.code in (grpc.StatusCode.PERMISSION_DENIED,
                                  grpc.StatusCode.INVALID_ARGUMENT):
                    raise error
                missed.append((node, str(error)))
            elif error is not None:
                raise error
            else:
                answers.append(future.result())
        return Trace(message_id, merge(answer.rows for answer in answers),
                     [answer.node for answer in answers], missed,
                     any(answer.truncated for answer in answers))

    def _unary(self, method: grpc.UnaryUnaryMultiCallable[RequestT, ResponseT],
               request: RequestT) -> ResponseT:
        try:
            return method(request, timeout=self._timeout_s)
        except grpc.RpcError as error:
            raise translate(error) from None

    def _stub(self, node: Node) -> pb_grpc.LedgerStub:
        with self._lock:
            channel = self._channels.get(node.grpc_address)
            if channel is None:
                channel = self._channels[node.grpc_address] = open_channel(
                    node.grpc_address, self._credentials, CHANNEL_OPTIONS)
        return pb_grpc.LedgerStub(channel)


def merge(answers: Iterable[Sequence[pb.TraceRow]]) -> list[TracedEvent]:
    """Every node's rows as one list by time (then by when the first node recorded it): a
    committed event recorded by several nodes (the same event, time, handle, lease ...) is
    one event naming them all."""
    merged: dict[tuple[object, ...], tuple[pb.TraceRow, list[str]]] = {}
    for rows in answers:
        for row in rows:
            details = tuple(getattr(row, name) if row.HasField(name) else None
                            for name in _DETAILS)
            own = row.node if row.event in OWN_EVENTS else ""
            row_nodes = merged.setdefault((row.event, row.time_ms, own, details), (row, []))[1]
            if row.node not in row_nodes:
                row_nodes.append(row.node)
    ordered = sorted(merged.values(), key=lambda held: (held[0].time_ms, held[0].node_ms))
    return [TracedEvent(row.event, row.time_ms, tuple(sorted(nodes)), **{
        name: getattr(row, name) if row.HasField(name) else None for name in _DETAILS})
        for row, nodes in ordered]
