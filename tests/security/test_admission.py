"""Strangers and tenants against a node's call slots and memory (issue 37): a real node started
as users start it (TLS, tokens, an access file with a ``tenant`` granted only its own topic),
attacked over its public gRPC port while the admin works beside them.

On the build before this, a request was read and parsed in full before its token was checked
(128 anonymous 7.5 MiB calls grew a node by gigabytes), 1,100 calls whose requests never
arrived held all 1,024 call slots (the admin refused 45 of 45), a tenant's 1,100 idle streams
did the same, reflection answered anyone, and a connection that never began TLS was kept for
two minutes.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tickwheel.client import Client, Credentials
from tickwheel.client.credentials import open_channel
from tickwheel.harness.local_cluster import LocalCluster, LocalNode
from tickwheel.v1 import tickwheel_pb2 as pb

pytestmark = pytest.mark.cluster

PRINCIPALS = {"tenant": [{"actions": ["schedule", "cancel", "consume"], "topics": ["tenant"]}]}
READ_TIMEOUT_MS = 2_000
"""The node's ``--request-read-timeout-ms`` here (10 s by default), to keep the test short."""
GROWTH_LIMIT_MB = 64
"""What an attack may grow the node by (the issue's bound)."""
HALF_SENT_CALLS = 1_100
BIG_CALLS = 128
BIG_REQUEST = pb.ScheduleRequest(messages=[
    pb.Message(id=f"big-{i}", topic="tenant", body=b"x" * (3_750 << 10), delay_ms=60_000)
    for i in range(2)]).SerializeToString()
"""7.5 MiB, under the node's 8 MiB request limit: read in full by the build before this."""
SCHEDULE = "/tickwheel.v1.Tickwheel/Schedule"
RECEIVE = "/tickwheel.v1.Tickwheel/Receive"
T = TypeVar("T")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNode]:
    with LocalCluster(tmp_path_factory.mktemp("admission"), size=1, principals=PRINCIPALS,
                      extra_args=("--request-read-timeout-ms", str(READ_TIMEOUT_MS))
                      ) as cluster:
        yield cluster.leader(timeout_s=30)


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


class PeakRss:
    """Samples a process's RSS every 20 ms until closed."""

    def __init__(self, pid: int) -> None:
        self.base_mb = self.peak_mb = rss_mb(pid)
        self._pid = pid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak_mb = max(self.peak_mb, rss_mb(self._pid))

    def growth_mb(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak_mb - self.base_mb


def admin_calls(node: LocalNode, count: int) -> list[str]:
    """``count`` schedule and info calls of the admin, one after another; what was refused."""
    refused = []
    with Client(node.grpc_address, credentials=node.credentials, timeout_s=10) as admin:
        for i in range(count):
            try:
                admin.schedule("admin", b"x", delay_ms=60_000, id=f"admin-{time.time_ns()}-{i}")
                admin.cluster_info()
            except Exception as error:  # every refusal is the finding
                refused.append(repr(error))
    return refused


def channels(node: LocalNode, credentials: Credentials, count: int) -> list[grpc.aio.Channel]:
    """``count`` channels on connections of their own (TLS; a call passes the token,
    ``credentials.call_metadata()``)."""
    options = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_send_message_length", 16 << 20)]
    return [grpc.aio.secure_channel(node.grpc_address, credentials.tls_credentials(),
                                    options) for _ in range(count)]


Attack = Callable[[asyncio.Event, asyncio.Event], Awaitable[T]]
"""Opens its calls, sets the first event, holds them until the second is set."""


async def while_attacked(attack: Attack[T], node: LocalNode, admin_count: int
                         ) -> tuple[list[str], T]:
    """Run ``attack`` and, once its calls are open, the admin's calls beside it."""
    under_way, admin_done = asyncio.Event(), asyncio.Event()
    attacking = asyncio.ensure_future(attack(under_way, admin_done))
    # An attack that fails before its calls are open fails the test now, not at its timeout.
    opened = asyncio.ensure_future(under_way.wait())
    await asyncio.wait([attacking, opened], return_when=asyncio.FIRST_COMPLETED)
    if not opened.done():
        opened.cancel()
        attacking.result()  # raises what ended it
        raise AssertionError("the attack ended before its calls were open")
    try:
        refused = await asyncio.to_thread(admin_calls, node, admin_count)
    finally:
        admin_done.set()
    return refused, await attacking


async def outcomes(calls: list[grpc.aio.Call]) -> dict[str, int]:
    """How many of ``calls`` are still open, and how many ended with each status code."""
    names = ["open" if not call.done() else (await call.code()).name for call in calls]

    return {name: names.count(name) for name in sorted(set(names))}


def anonymous(node: LocalNode) -> Credentials:
    assert node.credentials.ca is not None
    return Credentials(ca=node.credentials.ca)


def test_strangers_hold_no_call_slot_and_no_memory(node: LocalNode) -> None:
    """1,100 calls that never send their request and 128 of 7.5 MiB, all without a token, while
    the admin calls the same node: it is refused nothing, and the node grows by at most 64 MB."""
    peak = PeakRss(node.pid)

    async def attack(under_way: asyncio.Event, admin_done: asyncio.Event
                     ) -> tuple[dict[str, int], dict[str, int]]:
        opened = channels(node, anonymous(node), 11)
        half_sent = [opened[i % 11].stream_unary(SCHEDULE)() for i in range(HALF_SENT_CALLS)]
        big = [opened[i % 11].unary_unary(SCHEDULE)(BIG_REQUEST, timeout=60)
               for i in range(BIG_CALLS)]
        try:
            under_way.set()
            await admin_done.wait()
            return await outcomes(half_sent), await outcomes(big)
        finally:
            for call in [*half_sent, *big]:
                call.cancel()
            for channel in opened:
                await channel.close()

    refused, ended = asyncio.run(while_attacked(attack, node, 20))
    growth_mb = peak.growth_mb()
    assert refused == []
    # every call ended, refused: UNAUTHENTICATED, or CANCELLED where the node's reset of the
    # rest of the stream reached the client first (a big request still being sent, or a
    # loaded host)
    for calls in ended:
        assert set(calls) <= {"UNAUTHENTICATED", "CANCELLED"}, calls
        assert calls.get("UNAUTHENTICATED", 0) > sum(calls.values()) // 2, calls
    assert growth_mb <= GROWTH_LIMIT_MB, f"the node grew by {growth_mb:.0f} MB"


def test_a_tenant_cannot_take_the_slots_others_need(node: LocalNode) -> None:
    """A tenant opens 1,100 consumer streams and leaves them idle: past its share it is refused,
    and the admin's calls on the same node all succeed."""
    assert node.credentials.ca is not None
    tenant = Credentials(ca=node.credentials.ca, token=tenant_token(node))
    token = tenant.call_metadata()
    peak = PeakRss(node.pid)

    async def attack(under_way: asyncio.Event, admin_done: asyncio.Event) -> dict[str, int]:
        opened = channels(node, tenant, 11)
        streams = []
        try:
            for i in range(HALF_SENT_CALLS):
                streams.append(opened[i % 11].stream_stream(
                    RECEIVE, pb.ReceiveRequest.SerializeToString, pb.ReceiveResponse.FromString,
                )(subscribe_then_idle(f"idle-{i}", admin_done), metadata=token))
            await asyncio.wait_for(subscribed(node, "tenant", 256), 60)
            one_more = opened[0].stream_stream(RECEIVE)(metadata=token)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await one_more.read()
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max_principal_rpcs" in (caught.value.details() or "")
            under_way.set()
            await admin_done.wait()
            return await outcomes(streams)
        finally:
            for stream in streams:
                stream.cancel()
            for channel in opened:
                await channel.close()

    refused, ended = asyncio.run(while_attacked(attack, node, 20))
    growth_mb = peak.growth_mb()
    assert refused == []
    # the refused ones ended at once: RESOURCE_EXHAUSTED, or where the client's write of the
    # subscription raced the refusal, the stream's reset as gRPC reports it (INTERNAL, or
    # CANCELLED for a reset whose code is CANCEL: 1 of 844 in a CI run)
    assert ended.pop("open") == 256
    assert set(ended) <= {"RESOURCE_EXHAUSTED", "INTERNAL", "CANCELLED"}, ended
    assert growth_mb <= GROWTH_LIMIT_MB, f"the node grew by {growth_mb:.0f} MB"


async def subscribe_then_idle(consumer: str, done: asyncio.Event
                              ) -> AsyncIterator[pb.ReceiveRequest]:
    yield pb.ReceiveRequest(subscribe=pb.Subscribe(topic="tenant", consumer=consumer, credits=1))
    await done.wait()


async def subscribed(node: LocalNode, topic: str, count: int) -> None:
    """Until ``count`` consumers of ``topic`` are counted by the node."""
    while True:
        info = await asyncio.to_thread(node.info, 5.0)
        if info is not None and sum(t.consumers for t in info.topics if t.topic == topic) >= count:
            return
        await asyncio.sleep(0.1)


def tenant_token(node: LocalNode) -> str:
    token_file = node.data.parent / "security" / "tokens" / "tenant.token"
    return token_file.read_text().strip()


def test_a_call_whose_request_never_arrives_is_ended(node: LocalNode) -> None:
    """An authenticated call that never sends its request, and a stream that never subscribes,
    are ended after ``request_read_timeout_ms`` instead of holding their slots."""
    async def ended_after(call: grpc.aio.Call, started: float) -> tuple[grpc.StatusCode, float]:
        async with asyncio.timeout(READ_TIMEOUT_MS / 1000 + 10):
            code = await call.code()
        return code, time.monotonic() - started

    async def wait_out() -> list[tuple[grpc.StatusCode, float]]:
        (channel,) = channels(node, node.credentials, 1)
        try:
            started = time.monotonic()
            token = node.credentials.call_metadata()
            calls = (channel.stream_unary(SCHEDULE)(metadata=token),
                     channel.stream_stream(RECEIVE)(metadata=token))
            return list(await asyncio.gather(*(ended_after(call, started) for call in calls)))
        finally:
            await channel.close()

    ended = asyncio.run(wait_out())
    assert [code for code, _ in ended] == [grpc.StatusCode.DEADLINE_EXCEEDED,
                                           grpc.StatusCode.INVALID_ARGUMENT]
    assert all(READ_TIMEOUT_MS / 1000 - 0.5 <= took <= READ_TIMEOUT_MS / 1000 + 5
               for _, took in ended), ended


def test_a_connection_that_never_begins_tls_is_closed(node: LocalNode) -> None:
    """A TCP connection that sends nothing is closed after the handshake timeout (5 s)."""
    host, port = node.grpc_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=20) as silent:
        started = time.monotonic()
        assert silent.recv(1) == b""
        assert time.monotonic() - started < 15


def test_reflection_answers_authenticated_callers_only(node: LocalNode) -> None:
    def list_services(credentials: Credentials) -> list[str]:
        with open_channel(node.grpc_address, credentials, ()) as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            (answer,) = stub.ServerReflectionInfo(iter([
                reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
            return [service.name for service in answer.list_services_response.service]

    assert node.credentials.ca is not None
    for stranger in (anonymous(node), Credentials(ca=node.credentials.ca, token="made-up")):
        with pytest.raises(grpc.RpcError) as caught:
            list_services(stranger)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "tickwheel.v1.Tickwheel" in list_services(node.credentials)
