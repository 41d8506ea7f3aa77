"""The gRPC ports against callers without credentials, or with another topic's (issue 17):
real 3-node clusters started as users start them (TLS, tokens, an access file), attacked
through both the leader and a follower (which forwards to the leader's peer listener).

On the build before this, every call below succeeded: the port was plaintext and open.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from tickwheel.client import (
    AsyncClient,
    CancelOutcome,
    Client,
    Credentials,
    Message,
    PermissionDenied,
    Unauthenticated,
)
from tickwheel.client.credentials import open_channel
from tickwheel.harness.local_cluster import LocalCluster, LocalNode, wait_for
from tickwheel.node.security import dev_credentials
from tickwheel.node.security.identity import PEER_KEY, PRINCIPAL_KEY
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.v1 import tickwheel_pb2_grpc as pb_grpc

pytestmark = pytest.mark.cluster

PRINCIPALS = {
    "orders": [{"actions": ["schedule", "cancel"], "topics": ["orders"]},
               {"actions": ["consume"], "topics": ["orders"], "groups": ["billing"]}],
    "other": [{"actions": ["schedule", "cancel", "consume"], "topics": ["other"]}],
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("auth"), principals=PRINCIPALS) as started:
        started.leader(timeout_s=30)
        with started.client() as admin:  # a group gets what comes due after it exists
            admin.create_group("orders", "billing")
        yield started


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def nodes(cluster: LocalCluster) -> list[LocalNode]:
    """The leader, then a follower: each call is tried on both."""
    leader = cluster.leader()
    return [leader, next(node for node in cluster.nodes if node is not leader)]


def client_of(cluster: LocalCluster, node: LocalNode, credentials: Credentials) -> Client:
    """A client that calls ``node`` only (it does not move to the leader it learns of)."""
    return Client(node.grpc_address, timeout_s=10, credentials=credentials)


def first_received(client: Client, topic: str, group: str = "") -> object:
    with client.consume(topic, group=group) as consumer:
        return next(iter(consumer))


def test_a_caller_without_a_token_or_with_a_made_up_one_gets_nothing(
        cluster: LocalCluster) -> None:
    assert cluster.security is not None
    no_token = Credentials.load(ca_file=cluster.security.ca_file)
    made_up = Credentials(ca=no_token.ca, token="made-up-token")
    for node in nodes(cluster):
        for credentials in (no_token, made_up):
            with client_of(cluster, node, credentials) as client:
                for call in (lambda c: c.schedule("orders", b"x", delay_ms=0),
                             lambda c: c.cluster_info(),
                             lambda c: c.cancel_outcomes([1]),
                             lambda c: c.receive("orders", max_messages=1, wait_ms=0, consumer="t"),
                             lambda c: first_received(c, "orders")):
                    with pytest.raises(Unauthenticated):
                        call(client)


CALLS = 50
"""Calls made with a token in the tests of threads started per call."""


@contextlib.contextmanager
def threads_started() -> Iterator[list[threading.Thread]]:
    """The threads started meanwhile, by any thread of this process."""
    started: list[threading.Thread] = []
    start = threading.Thread.start

    def counted(thread: threading.Thread) -> None:
        started.append(thread)
        start(thread)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(threading.Thread, "start", counted)
        yield started


def test_a_token_rides_on_each_call_without_a_thread_per_call(cluster: LocalCluster) -> None:
    """gRPC's call credentials start a thread for every call to fetch the token (a third of a
    unary call's CPU in the client); the client's channels send it as metadata instead, and
    it still authenticates on the leader and through a follower. (grpcio starts a few
    threads of its own now and then, named ``_run``: 2 and 6 in a loaded CI run, 16 in a
    full ``make test`` beside a chaos run's Spark; which of its channels they served is not
    known. A thread per call would be ``CALLS``.)"""
    tag = uuid.uuid4().hex[:8]
    for node in nodes(cluster):
        with client_of(cluster, node, cluster.credentials("orders")) as orders:
            orders.schedule("orders", b"warm", delay_ms=60_000, id=f"w-{tag}-{node.raft}")
            with threads_started() as started:
                handles = [orders.schedule("orders", b"x", delay_ms=60_000,
                                           id=f"t-{tag}-{node.raft}-{i}") for i in range(CALLS)]
        assert len({scheduled.handle for scheduled in handles}) == CALLS
        assert not any(scheduled.duplicate for scheduled in handles)
        assert len(started) < CALLS // 2, started


def test_the_asyncio_client_sends_its_token_without_a_thread_per_call(
        cluster: LocalCluster) -> None:
    """`AsyncClient` too: its calls and its consumer's stream carry the token as metadata
    (gRPC's call credentials started a thread for each), through the leader and a
    follower."""
    tag = uuid.uuid4().hex[:8]

    async def calls(node: LocalNode) -> tuple[list[int], list[threading.Thread]]:
        async with AsyncClient(node.grpc_address, timeout_s=10,
                               credentials=cluster.credentials("orders")) as orders:
            await orders.schedule("orders", b"warm", delay_ms=60_000, id=f"w-{tag}-{node.raft}")
            with threads_started() as started:
                handles = [(await orders.schedule("orders", b"x", delay_ms=60_000,
                                                  id=f"a-{tag}-{node.raft}-{i}")).handle
                           for i in range(CALLS)]
                due = f"d-{tag}-{node.raft}"
                await orders.schedule("orders", b"due", delay_ms=0, id=due)
                async with orders.consume("orders", group="billing") as consumer:
                    async for message in consumer:
                        message.ack()
                        if message.id == due:
                            break
            return handles, started
    for node in nodes(cluster):
        handles, started = asyncio.run(calls(node))
        assert len(set(handles)) == CALLS
        assert len(started) < CALLS // 2, started


def test_plaintext_reaches_nothing_on_a_tls_port(cluster: LocalCluster) -> None:
    with Client(cluster.nodes[0].grpc_address, timeout_s=2,
                credentials=Credentials(insecure=True)) as client, \
            pytest.raises(Exception) as refused:
        client.cluster_info()
    assert "UNAVAILABLE" in str(refused.value)


def test_credentials_for_one_topic_cannot_schedule_read_cancel_or_ack_another(
        cluster: LocalCluster) -> None:
    tag = uuid.uuid4().hex[:8]
    with cluster.client("orders", timeout_s=20) as orders:
        kept = orders.schedule_many([Message("orders", b"keep", delay_ms=60_000, id=f"k-{tag}"),
                                     Message("orders", b"ack", delay_ms=0, id=f"a-{tag}")])
        (received,) = wait_for(lambda: orders.receive("orders", group="billing",
                                                      consumer="t", max_messages=1,
                                                      wait_ms=500), 20,
                               "the due message for billing")
        assert received.id == f"a-{tag}"
    for node in nodes(cluster):
        with client_of(cluster, node, cluster.credentials("other")) as other:
            with pytest.raises(PermissionDenied) as refused:
                other.schedule("orders", b"x", delay_ms=0)
            assert refused.value.field == "messages[0].topic"
            assert "principal 'other' may not schedule on topic 'orders'" in str(refused.value)
            with pytest.raises(PermissionDenied):  # one topic of a batch is enough
                other.schedule_many([Message("other", b"x", delay_ms=0),
                                     Message("orders", b"x", delay_ms=0)])
            with pytest.raises(PermissionDenied) as refused:
                other.cancel_outcomes([kept[0].handle])  # a real handle, leaked
            assert refused.value.field == "handles[0]"
            with pytest.raises(PermissionDenied) as refused:
                other.reschedule([kept[0].handle], delay_ms=0)
            assert refused.value.field == "moves[0].handle"
            with pytest.raises(PermissionDenied):
                other.receive("orders", group="billing", max_messages=1, wait_ms=0, consumer="t")
            with pytest.raises(PermissionDenied):
                other.ack_receipts("orders", "billing", [received.receipt])
            with pytest.raises(PermissionDenied):
                first_received(other, "orders", "billing")
            info = other.cluster_info()
            assert "orders" not in {t.topic for t in info.pending} | {
                g.topic for g in info.groups}
    with cluster.client("orders", timeout_s=20) as orders:
        # nothing the refused calls named was touched: the receipt still acks, once
        assert orders.ack_receipts("orders", "billing", [received.receipt]) == [True]
        # and the leaked handle's message was neither cancelled nor moved
        assert orders.cancel_outcomes([kept[0].handle]) == [CancelOutcome.CANCELLED]


def test_a_refused_topic_fails_only_its_own_call_among_concurrent_schedules(
        cluster: LocalCluster) -> None:
    """``schedule`` calls from several threads share requests, and the node refuses a request
    whole when one topic of it is not the caller's: each call still gets its own answer."""
    tag = uuid.uuid4().hex[:8]

    def call(i: int) -> str:
        try:
            return other.schedule("orders" if i % 4 == 0 else "other", b"x", delay_ms=60_000,
                                  id=f"{tag}-{i}").id
        except PermissionDenied as refused:
            return refused.field
    with client_of(cluster, cluster.leader(), cluster.credentials("other")) as other, \
            ThreadPoolExecutor(8) as pool:
        got = list(pool.map(call, range(64)))
    assert got == ["messages[0].topic" if i % 4 == 0 else f"{tag}-{i}" for i in range(64)]


def test_grants_are_per_group_and_per_action(cluster: LocalCluster) -> None:
    with cluster.client("orders", timeout_s=20) as orders:
        with pytest.raises(PermissionDenied):
            orders.receive("orders", group="shipping", max_messages=1, wait_ms=0, consumer="t")
        with pytest.raises(PermissionDenied):  # consume, not admin
            orders.delete_group("orders", "billing")
        with pytest.raises(PermissionDenied):
            orders.create_group("orders", "shipping")
        orders.create_group("orders", "billing")  # what subscribing to it does anyway
    with cluster.client("other", timeout_s=20) as other:
        other.schedule("other", b"fine", delay_ms=0)


def test_the_peer_listener_serves_members_only(cluster: LocalCluster) -> None:
    """A client's own token, or a forged principal, opens nothing there; and the client
    listener does not serve `Peer` at all."""
    node = cluster.nodes[0]
    admin = cluster.credentials()
    read = pb.ReadStateFileRequest(path="manifest", offset=0, size=10)
    with open_channel(node.peer_address, admin, ()) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            list(pb_grpc.PeerStub(channel).ReadStateFile(read, timeout=5))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as refused:
            list(pb_grpc.PeerStub(channel).ReadStateFiles(
                pb.ReadStateFilesRequest(ranges=[read]), timeout=5))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as refused:  # which ids exist, for a growth
            pb_grpc.PeerStub(channel).Remembered(pb.RememberedRequest(ids=["a"]), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        forged = ((PEER_KEY, "0" * 64), (PRINCIPAL_KEY, "admin"))
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.TickwheelStub(channel).Schedule(pb.ScheduleRequest(messages=[pb.Message(
                id="forged", topic="orders", body=b"x", deliver_at_ms=now_ms())]),
                metadata=forged, timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with open_channel(node.grpc_address, admin, ()) as channel, \
            pytest.raises(grpc.RpcError) as refused:
        list(pb_grpc.PeerStub(channel).ReadStateFile(read, timeout=5))
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_token_removed_from_the_access_file_stops_working_without_a_restart(
        tmp_path: Path) -> None:
    with LocalCluster(tmp_path, size=1, principals=PRINCIPALS) as single:
        single.leader(timeout_s=30)
        assert single.security is not None
        with single.client("other", timeout_s=5) as other:
            other.schedule("other", b"before", delay_ms=0)
            access = single.security.access_file
            kept = access.read_text().split("[[principal]]")
            access.write_text("[[principal]]".join(
                part for part in kept if 'name = "other"' not in part))

            def refused() -> bool:
                try:
                    other.schedule("other", b"after", delay_ms=0)
                except Unauthenticated:
                    return True
                return False
            wait_for(refused, 15, "the removed token to be refused", poll_s=0.2)
        access.write_text("not toml [")  # a broken file keeps the last good one in force
        with single.client(timeout_s=5) as admin:
            wait_for(lambda: "event=access_file_refused" in single.nodes[0].log_path.read_text(),
                     15, "the broken access file to be refused")
            assert admin.cluster_info().role == "leader"


def test_mutual_tls_names_the_principal_by_its_certificate(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, size=1, principals=PRINCIPALS,
                      client_certificates=True) as single:
        single.leader(timeout_s=30)
        assert single.security is not None
        cert_file, key_file = single.security.client_certificate("other")
        by_certificate = Credentials.load(ca_file=single.security.ca_file, cert_file=cert_file,
                                          key_file=key_file)
        with Client(single.nodes[0].grpc_address, timeout_s=10,
                    credentials=by_certificate) as other:
            other.schedule("other", b"x", delay_ms=0)
            with pytest.raises(PermissionDenied):
                other.schedule("orders", b"x", delay_ms=0)
        token_only = Credentials.load(ca_file=single.security.ca_file,
                                      token_file=single.security.token_file("admin"))
        with Client(single.nodes[0].grpc_address, timeout_s=2,
                    credentials=token_only) as admin, pytest.raises(Exception) as refused:
            admin.cluster_info()  # no certificate: the handshake itself fails
        assert "UNAVAILABLE" in str(refused.value)


def test_a_renewed_certificate_serves_new_connections_without_a_restart(tmp_path: Path) -> None:
    """As cert-manager renews a Secret's mount: the files change under a running node. A
    certificate from another CA makes the switch visible: clients trusting only the old CA
    are refused once the node serves the new one."""
    with LocalCluster(tmp_path / "cluster", size=1) as single:
        single.leader(timeout_s=30)
        security = single.security
        assert security is not None
        renewed = dev_credentials.make(tmp_path / "renewed")
        node = single.nodes[0]

        def info(ca_file: Path, timeout_s: float = 10) -> object:
            credentials = Credentials.load(ca_file=ca_file,
                                           token_file=security.token_file("admin"))
            with Client(node.grpc_address, timeout_s=timeout_s,
                        credentials=credentials) as client:
                return client.cluster_info()

        info(security.ca_file)
        # Half a renewal (the certificate replaced, not yet its key): refused, the old pair
        # still serves.
        replace_file(security.cert_file, renewed.cert_file.read_bytes())
        info(security.ca_file)
        assert "event=tls_certificate_refused" in node.log_path.read_text()
        replace_file(security.key_file, renewed.key_file.read_bytes())
        info(renewed.ca_file)
        assert "event=tls_certificate_loaded" in node.log_path.read_text()
        with pytest.raises(Exception) as refused:
            info(security.ca_file, timeout_s=2)
        assert "UNAVAILABLE" in str(refused.value)
        assert node.process is not None and node.process.poll() is None


def replace_file(path: Path, data: bytes) -> None:
    """Swap ``path``'s content at once, as a Secret's mount does."""
    staged = path.with_name(path.name + ".new")
    staged.write_bytes(data)
    os.replace(staged, path)
