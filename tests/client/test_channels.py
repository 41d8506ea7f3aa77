"""The channels the client library and the nodes open give up on a connection whose handshake
never ends: a stopped process's kernel still accepts its connections, and gRPC waited 20 s in
the handshake, where no keepalive ping reaches (the consumer of a paused leader stayed with it
until it resumed)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import grpc
import pytest

from tickwheel.client._core import CHANNEL_OPTIONS, CONNECT_TIMEOUT_MS
from tickwheel.client.credentials import Credentials, open_aio_channel, open_channel
from tickwheel.node.api.forward import FORWARD_OPTIONS

RECEIVE = "/tickwheel.v1.Tickwheel/Receive"
BOUND_S = 3 * CONNECT_TIMEOUT_MS / 1000
"""How long a stream there may take to fail: the connect timeout and what a busy machine adds;
gRPC's default was 20 s."""


@pytest.fixture
def silent() -> Iterator[str]:
    """An address that accepts connections (the kernel's backlog) and never says a word."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"127.0.0.1:{listener.getsockname()[1]}"


@pytest.mark.parametrize("credentials", [Credentials(insecure=True), Credentials()],
                         ids=["plaintext", "tls"])
def test_a_client_stream_to_a_silent_process_fails_within_the_connect_timeout(
        silent: str, credentials: Credentials) -> None:
    channel = open_channel(silent, credentials, CHANNEL_OPTIONS)
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as failed:
        next(channel.stream_stream(RECEIVE)(iter([b""])))
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - started < BOUND_S
    channel.close()


def test_a_stream_a_follower_passes_to_a_silent_leader_fails_within_the_connect_timeout(
        silent: str) -> None:
    async def stream() -> float:
        channel = open_aio_channel(silent, Credentials(), FORWARD_OPTIONS)
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await channel.stream_stream(RECEIVE)().read()
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        await channel.close()
        return time.monotonic() - started
    assert asyncio.run(stream()) < BOUND_S
