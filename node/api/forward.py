"""Followers forward client calls to the leader's peer listener, once.

A forwarded call carries ``tickwheel-forwarded``, the peer token and the caller's principal
(`tickwheel.node.security.identity`); a node that receives one and does not lead
answers ``UNAVAILABLE`` instead of forwarding again, so calls never loop during an election (the
client retries). Channels to the other members are opened on first use and kept.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import grpc

from tickwheel.client.credentials import Credentials, open_aio_channel
from tickwheel.common.status_details import STATUS_DETAILS_KEY
from tickwheel.node.delivery.batches import GRPC_MESSAGE_BYTES
from tickwheel.node.security.access import Principal
from tickwheel.node.security.identity import CallMetadata, PeerCallers
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.v1 import tickwheel_pb2_grpc as pb_grpc

FORWARDED_KEY = "tickwheel-forwarded"
LEADER_KEY = "tickwheel-leader"
"""Trailing metadata on every response: the leader's gRPC address, when known."""
FORWARDED = ((FORWARDED_KEY, "1"),)
log = logging.getLogger("tickwheel.node")
_Receive = grpc.aio.StreamStreamCall[pb.ReceiveRequest, pb.ReceiveResponse]
CHANNEL_OPTIONS = (("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", GRPC_MESSAGE_BYTES),
                   ("grpc.keepalive_time_ms", 2_000), ("grpc.keepalive_timeout_ms", 2_000),
                   # Let clients ping every 250 ms (their keepalive) without being cut off.
                   ("grpc.http2.min_ping_interval_without_data_ms", 200),
                   ("grpc.http2.max_ping_strikes", 0))
"""The listeners' options, and the base of `FORWARD_OPTIONS`."""
FORWARD_OPTIONS = (*(option for option in CHANNEL_OPTIONS
                     if not option[0].startswith("grpc.keepalive")),
                   ("grpc.keepalive_time_ms", 250), ("grpc.keepalive_timeout_ms", 500),
                   ("grpc.http2.ping_timeout_ms", 500), ("grpc.http2.max_pings_without_data", 0),
                   ("grpc.min_reconnect_backoff_ms", 1_000),
                   ("grpc.max_reconnect_backoff_ms", 2_000))
"""A follower's channel to its leader pings, and bounds a connection's handshake, as the client
library does (``tickwheel.client``'s ``KEEPALIVE_OPTIONS``), so that a consumer stream it passes
through to a paused leader breaks within a second, and its consumer goes to the new leader.
A member that was down is dialed again within 2 s of its return: gRPC's back-off between
attempts grows to 2 minutes by default, and a member stopped for a minute (polled for its
disk space meanwhile) was unreachable through its channel for 20 s and more once back."""


def forwarded(callers: PeerCallers, principal: Principal) -> tuple[tuple[str, str], ...]:
    """What a call forwarded for ``principal`` to a member's peer listener carries."""
    return FORWARDED + callers.metadata(principal)


def was_forwarded(context: CallMetadata) -> bool:
    return any(key == FORWARDED_KEY for key, _ in context.invocation_metadata() or ())


@dataclass(eq=False, slots=True)
class Passage:
    """A consumer stream this node passes through to ``leader`` (its peer listener)."""

    leader: str
    call: _Receive
    moved: bool = False
    """Whether it was cancelled because this node follows another leader now."""


class Forwarder:
    """Stubs for the other members, by peer listener address, dialed with ``credentials``."""

    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._passages: set[Passage] = set()

    @contextlib.contextmanager
    def passing(self, leader: str, call: _Receive) -> Iterator[Passage]:
        """``call``, a consumer stream passed through to ``leader``, while it is open."""
        passage = Passage(leader, call)
        self._passages.add(passage)
        try:
            yield passage
        finally:
            self._passages.discard(passage)

    def leader_moved(self, leader: str | None) -> None:
        """This node follows ``leader`` now (its peer listener; None: none known): the consumer
        streams passed through to another member are cancelled, so that their consumers go to
        the new leader. Keepalive pings break a stream to a paused leader only once its
        connection is up: one opened to it while it is stopped waits in the handshake, which
        no ping covers, for gRPC's connect timeout (20 s)."""
        moved = [p for p in self._passages if p.leader != leader and not p.moved]
        for passage in moved:
            passage.moved = True
            passage.call.cancel()
        if moved:
            log.info("event=consumer_streams_ended streams=%d leader=%s", len(moved), leader)

    def stub(self, peer_address: str) -> pb_grpc.TickwheelAsyncStub:
        return pb_grpc.TickwheelStub(self._channel(peer_address))

    def peer_stub(self, peer_address: str) -> pb_grpc.PeerAsyncStub:
        """The member's `Peer` service, on the same channel."""
        return pb_grpc.PeerStub(self._channel(peer_address))

    def _channel(self, peer_address: str) -> grpc.aio.Channel:
        channel = self._channels.get(peer_address)
        if channel is None:
            channel = self._channels[peer_address] = open_aio_channel(
                peer_address, self._credentials, FORWARD_OPTIONS)
        return channel

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()


class LeaderRefused(Exception):
    """The leader answered a forwarded call with an error status; ``trailers``: the status
    details it carried (``grpc-status-details-bin``: a quota's ``RetryInfo``), to be passed on
    to the caller as they came."""

    def __init__(self, code: grpc.StatusCode, details: str,
                 trailers: tuple[tuple[str, str | bytes], ...] = ()) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.trailers = trailers

    @classmethod
    def of(cls, failed: grpc.aio.AioRpcError) -> LeaderRefused:
        return cls(failed.code(), failed.details() or "", status_details(failed))


def status_details(failed: grpc.aio.AioRpcError) -> tuple[tuple[str, str | bytes], ...]:
    """The ``grpc-status-details-bin`` trailer of a failed call, if it has one."""
    return tuple((key, value) for key, value in failed.trailing_metadata() or ()
                 if key == STATUS_DETAILS_KEY)
