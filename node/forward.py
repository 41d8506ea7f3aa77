"""Followers forward client calls to the leader, once.

A forwarded call carries ``tickwheel-forwarded``; a node that receives one and does not lead
answers ``UNAVAILABLE`` instead of forwarding again, so calls never loop during an election (the
client retries). Channels to the other members are opened on first use and kept.
"""

from __future__ import annotations

import grpc

from tickwheel.v1 import tickwheel_pb2_grpc as pb_grpc

FORWARDED_KEY = "tickwheel-forwarded"
LEADER_KEY = "tickwheel-leader"
"""Trailing metadata on every response: the leader's gRPC address, when known."""
FORWARDED = ((FORWARDED_KEY, "1"),)
CHANNEL_OPTIONS = (("grpc.max_receive_message_length", 64 << 20),
                   ("grpc.max_send_message_length", 64 << 20),
                   ("grpc.keepalive_time_ms", 2_000), ("grpc.keepalive_timeout_ms", 2_000),
                   # Let clients ping every 2 s (their keepalive) without being cut off.
                   ("grpc.http2.min_ping_interval_without_data_ms", 1_000),
                   ("grpc.http2.max_ping_strikes", 0))


def was_forwarded(context: grpc.aio.ServicerContext) -> bool:
    return any(key == FORWARDED_KEY for key, _ in context.invocation_metadata() or ())


class Forwarder:
    """Stubs for the other members, by gRPC address."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}

    def stub(self, grpc_address: str) -> pb_grpc.TickwheelStub:
        channel = self._channels.get(grpc_address)
        if channel is None:
            channel = self._channels[grpc_address] = grpc.aio.insecure_channel(
                grpc_address, options=CHANNEL_OPTIONS)
        return pb_grpc.TickwheelStub(channel)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
