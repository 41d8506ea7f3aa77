"""How a node's gRPC servers are assembled, secured and bound: the client listener
(`TickwheelService`, the node's own ledger's `LedgerService`, standard health and reflection,
to authenticated callers), the peer listener (`TickwheelService` for the calls followers
forward, and `PeerService`, to members only), an optional RocketMQ listener
(`tickwheel.node.rocketmq`, secured as the client listener), and an optional plaintext listener
with the health service alone, for probes.

Each of the first three serves every call through a `Gate` (`tickwheel.node.api.admission`) that
authenticates and admits it before its request is read; they share the node's `Admission`,
so its limits hold over all of them. HTTP/2 itself is bounded per connection
(`ConnectionLimits`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from tickwheel.common.errors import InvariantViolation
from tickwheel.node.api.admission import MEMBERS, Authenticate, Gate
from tickwheel.node.api.context import NodeContext
from tickwheel.node.api.forward import CHANNEL_OPTIONS
from tickwheel.node.api.growth import remembered
from tickwheel.node.api.info import describe
from tickwheel.node.api.ledger_calls import SERVICE_NAME as LEDGER_SERVICE
from tickwheel.node.api.ledger_calls import LedgerService
from tickwheel.node.api.server import SERVICE_NAME, TickwheelService, add_tickwheel_service
from tickwheel.node.rocketmq.binding import add_messaging_service
from tickwheel.node.rocketmq.service import MessagingService
from tickwheel.node.rocketmq.signature import Signatures
from tickwheel.node.security.access import Principal
from tickwheel.node.security.identity import (
    PRINCIPAL_KEY,
    CallMetadata,
    ClientCallers,
    PeerCallers,
    metadata_value,
)
from tickwheel.v1 import ledger_pb2_grpc
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.v1 import tickwheel_pb2_grpc as pb_grpc

ROCKETMQ_KEEPALIVE = (("grpc.keepalive_permit_without_calls", 1),
                      ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
                      ("grpc.http2.max_ping_strikes", 0))
"""RocketMQ's clients ping idle connections (Java every 300 s, with no call in flight); gRPC's
defaults would answer with GOAWAY and drop the client's Telemetry stream."""
CHUNK_BYTES = 1 << 20
"""The largest piece of a state file one `PeerService.ReadStateFile` message carries."""
MAX_READ_RANGES = 1_024
MAX_READ_BYTES = 64 << 20
"""What one `PeerService.ReadStateFiles` call may ask for: ranges, and bytes over them."""


class PeerService(pb_grpc.PeerServicer):
    """What members ask each other directly (their gate admits members only)."""

    def __init__(self, node: NodeContext) -> None:
        self._node = node
        self._replica = node.replica
        self._disk = node.disk

    async def Describe(self, request: pb.DescribeRequest,
                       context: grpc.aio.ServicerContext[pb.DescribeRequest,
                                                         pb.DescribeResponse]
                       ) -> pb.DescribeResponse:
        return describe(self._node)

    async def Remembered(self, request: pb.RememberedRequest,
                         context: grpc.aio.ServicerContext[pb.RememberedRequest,
                                                           pb.RememberedResponse]
                         ) -> pb.RememberedResponse:
        return remembered(self._node, request)

    async def DiskSpace(self, request: pb.DiskSpaceRequest,
                        context: grpc.aio.ServicerContext[pb.DiskSpaceRequest,
                                                          pb.DiskSpaceResponse]
                        ) -> pb.DiskSpaceResponse:
        own = self._disk.own()
        return pb.DiskSpaceResponse(free_bytes=own.free_bytes, reserve_bytes=own.reserve_bytes)

    async def ReadStateFile(self, request: pb.ReadStateFileRequest,
                            context: grpc.aio.ServicerContext[pb.ReadStateFileRequest,
                                                              pb.FileChunk]
                            ) -> AsyncIterator[pb.FileChunk]:
        offset, end = request.offset, request.offset + request.size
        while offset < end:
            try:
                data = await asyncio.to_thread(self._replica.read_state_file, request.path,
                                               offset, min(CHUNK_BYTES, end - offset))
            except (OSError, ValueError) as error:
                await context.abort(grpc.StatusCode.NOT_FOUND, str(error))
            if not data:
                return
            yield pb.FileChunk(data=data)
            offset += len(data)

    async def ReadStateFiles(self, request: pb.ReadStateFilesRequest,
                             context: grpc.aio.ServicerContext[pb.ReadStateFilesRequest,
                                                               pb.FileChunk]
                             ) -> AsyncIterator[pb.FileChunk]:
        """`ReadStateFile` for many ranges in one call: a follower installing a snapshot asks
        for every file it lacks in a few calls rather than one each (each call waits a turn
        of this node's event loop). Ranges are read in groups of up to ``CHUNK_BYTES``, each
        group on one worker thread."""
        ranges = list(request.ranges)
        total = sum(max(r.size, 0) for r in ranges)
        if len(ranges) > MAX_READ_RANGES or total > MAX_READ_BYTES:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"ranges: {len(ranges)} ranges of {total} bytes; at most "
                                f"{MAX_READ_RANGES} ranges and {MAX_READ_BYTES} bytes a call")
        for group in _groups(ranges):
            try:
                pieces = await asyncio.to_thread(self._read_group, group)
            except (OSError, ValueError) as error:
                await context.abort(grpc.StatusCode.NOT_FOUND, str(error))
            for path, offset, data in pieces:
                yield pb.FileChunk(data=data, path=path, offset=offset)

    def _read_group(self, group: list[tuple[str, int, int]]) -> list[tuple[str, int, bytes]]:
        return [(path, offset, self._replica.read_state_file(path, offset, size))
                for path, offset, size in group]


def _groups(ranges: list[pb.ReadStateFileRequest]) -> list[list[tuple[str, int, int]]]:
    """``ranges`` as ``(path, offset, size)`` pieces of at most ``CHUNK_BYTES``, in order,
    gathered into groups of at most ``CHUNK_BYTES`` in all."""
    groups: list[list[tuple[str, int, int]]] = [[]]
    room = CHUNK_BYTES
    for asked in ranges:
        offset, end = asked.offset, asked.offset + max(asked.size, 0)
        while offset < end:
            size = min(CHUNK_BYTES, end - offset)
            if size > room:
                groups.append([])
                room = CHUNK_BYTES
            groups[-1].append((asked.path, offset, size))
            room -= size
            offset += size
    return [group for group in groups if group]


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What one HTTP/2 connection may hold, on every listener but the health one."""

    max_streams_per_connection: int = 256
    """Calls at once on one connection (HTTP/2 ``SETTINGS_MAX_CONCURRENT_STREAMS``)."""
    max_metadata_bytes: int = 16 << 10
    """A call's headers (HTTP/2 ``SETTINGS_MAX_HEADER_LIST_SIZE``)."""
    handshake_timeout_ms: int = 5_000
    """A connection that has not finished its TLS handshake by then is closed."""
    idle_connection_ms: int = 60_000
    """A connection without a call for this long is closed (clients reconnect by
    themselves): a connection whose every call was refused does not stay."""

    def options(self) -> list[tuple[str, int]]:
        return [("grpc.max_concurrent_streams", self.max_streams_per_connection),
                ("grpc.max_metadata_size", self.max_metadata_bytes),
                ("grpc.server_handshake_timeout_ms", self.handshake_timeout_ms),
                ("grpc.max_connection_idle_ms", self.idle_connection_ms)]


def peer_caller(callers: PeerCallers) -> Authenticate:
    """Who calls the peer listener: a member (`MEMBERS`), or the principal a member forwards
    a call for."""
    def authenticate(context: CallMetadata) -> Principal:
        if metadata_value(context, PRINCIPAL_KEY) is None:
            callers.member(context)
            return MEMBERS
        return callers.principal(context)
    return authenticate


def rocketmq_caller(signatures: Signatures) -> Authenticate:
    """Who signed a call to the RocketMQ listener."""
    def authenticate(context: CallMetadata) -> Principal:
        return signatures.principal({key: value for key, value
                                     in context.invocation_metadata() or ()
                                     if isinstance(value, str)})
    return authenticate


@dataclass(frozen=True, slots=True)
class Listeners:
    """Where a node serves, and how it secures each listener (credentials None: plaintext,
    ``insecure_grpc``)."""

    client: str
    client_credentials: grpc.ServerCredentials | None
    client_callers: ClientCallers
    peer: str | None
    """None for a node alone: it has no peers."""
    peer_credentials: grpc.ServerCredentials | None
    health: str | None = None
    """Where to serve the health service alone, in plaintext; None for nowhere."""
    rocketmq: str | None = None
    """Where to serve RocketMQ's `MessagingService`; None for nowhere."""
    rocketmq_credentials: grpc.ServerCredentials | None = None
    """The client listener's TLS, as credentials of its own (a server takes its own)."""
    rocketmq_advertise: str | None = None
    """``HOST:PORT`` RocketMQ routes name; None: the address the client asked with."""
    signatures: Signatures | None = None
    """Who signs RocketMQ calls; needed with ``rocketmq``."""
    connections: ConnectionLimits = ConnectionLimits()


async def start_server(node: NodeContext, listeners: Listeners
                       ) -> tuple[list[grpc.aio.Server], health.aio.HealthServicer]:
    """Bind and start the listeners; the health service starts NOT_SERVING (`Housekeeping`
    updates it)."""
    client = _server(node, listeners, listeners.client_callers.principal)
    add_tickwheel_service(TickwheelService(node), client)
    ledger_pb2_grpc.add_LedgerServicer_to_server(LedgerService(node), client)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, client)
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    reflection.enable_server_reflection(
        (SERVICE_NAME, LEDGER_SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME), client)
    _bind(client, listeners.client, listeners.client_credentials, "gRPC")
    servers = [client]
    if listeners.peer is not None:
        peer = _server(node, listeners, peer_caller(node.peer_callers))
        add_tickwheel_service(TickwheelService(node), peer)
        pb_grpc.add_PeerServicer_to_server(PeerService(node), peer)
        _bind(peer, listeners.peer, listeners.peer_credentials, "the peer listener")
        servers.append(peer)
    if listeners.rocketmq is not None:
        if listeners.signatures is None:
            raise InvariantViolation("the RocketMQ listener checks signatures")
        rocketmq = _server(node, listeners, rocketmq_caller(listeners.signatures),
                           ROCKETMQ_KEEPALIVE)
        add_messaging_service(MessagingService(node, TickwheelService(node),
                                               listeners.rocketmq_advertise), rocketmq)
        _bind(rocketmq, listeners.rocketmq, listeners.rocketmq_credentials,
              "the RocketMQ listener")
        servers.append(rocketmq)
    if listeners.health is not None:
        probes = grpc.aio.server(options=[("grpc.max_receive_message_length", 1024)],
                                 maximum_concurrent_rpcs=16)
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, probes)
        _bind(probes, listeners.health, None, "the health listener")
        servers.append(probes)
    for server in servers:
        await server.start()
    return servers, health_servicer


def _server(node: NodeContext, listeners: Listeners, authenticate: Authenticate,
            extra: tuple[tuple[str, int], ...] = ()) -> grpc.aio.Server:
    options = [(key, value) for key, value in CHANNEL_OPTIONS
               if key != "grpc.max_receive_message_length"]
    options.extend(extra)
    options.append(("grpc.max_receive_message_length", node.limits.max_request_bytes))
    # No bandwidth-delay probing: it grows a connection's flow-control window to megabytes,
    # and the bytes of a request that will be refused as too large pile up in it (8 such
    # requests at once grew a node by 2-33 MB with it, 0-0.3 MB without).
    options.append(("grpc.http2.bdp_probe", 0))
    options.extend(listeners.connections.options())
    gate = Gate(node.admission, authenticate,
                lambda code: node.metrics.rejected.labels(code.name).inc())
    return grpc.aio.server(options=options, interceptors=(gate,))


def _bind(server: grpc.aio.Server, address: str,
          credentials: grpc.ServerCredentials | None, what: str) -> None:
    port = (server.add_insecure_port(address) if credentials is None
            else server.add_secure_port(address, credentials))
    if port == 0:
        raise OSError(f"cannot bind {what} to {address}")
