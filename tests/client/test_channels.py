"""The channels the client library and the nodes open give up on a connection whose handshake
never ends: a stopped process's kernel still accepts its connections, and gRPC waited 20 s in
the handshake, where no keepalive ping reaches (the consumer of a paused leader stayed with it
until it resumed)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

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


OUTAGE_S = 25.0
"""How long the node is away: gRPC's own back-off between attempts reaches 10 s and more by
then (and 2 minutes in time)."""


class _Echo(grpc.GenericRpcHandler):
    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(lambda request, context: request)


def _back_after(address: str, options: tuple[tuple[str, int], ...]) -> float:
    """Call ``address`` every half second while nothing listens there (`OUTAGE_S`), then
    serve there; how long after that the channel's next call got through."""
    channel = grpc.insecure_channel(address, options=options)
    call = channel.unary_unary("/tickwheel.test/Echo")

    def answers() -> bool:
        try:
            return call(b"ping", timeout=0.5) == b"ping"
        except grpc.RpcError:
            return False
    away_until = time.monotonic() + OUTAGE_S
    while time.monotonic() < away_until:
        assert not answers()
        time.sleep(0.5)
    server = grpc.server(ThreadPoolExecutor(2), handlers=[_Echo()])
    server.add_insecure_port(address)
    server.start()
    try:
        back = time.monotonic()
        while not answers():
            time.sleep(0.05)
        return time.monotonic() - back
    finally:
        server.stop(None)
        channel.close()


@pytest.mark.cluster  # no process, but half a minute: not for make check
def test_a_node_back_after_an_outage_is_reached_again_within_seconds() -> None:
    """A client's channel and a member's channel to another member, to a node away for
    `OUTAGE_S` (a pod rescheduled): each reaches it within 2 s of its return (gRPC's default
    back-off kept it unreachable for 10 s and more, up to 2 minutes)."""
    ports = []
    for _ in range(2):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
    with ThreadPoolExecutor(2) as pool:
        waits = list(pool.map(_back_after, [f"127.0.0.1:{port}" for port in ports],
                              [CHANNEL_OPTIONS, FORWARD_OPTIONS]))
    assert all(wait < 2.5 for wait in waits), waits
