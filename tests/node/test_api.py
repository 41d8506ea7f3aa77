"""The public API end to end: real gRPC against a 3-node cluster of real `tickwheel serve`
processes, through the client library where a user would use it and raw stubs where the wire
itself is under test."""

from __future__ import annotations

import asyncio
import shutil
import signal
import threading
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from nodetests import now_ms, topic

from tickwheel.client import (
    AsyncClient,
    CancelOutcome,
    Client,
    Credentials,
    InvalidArgument,
    Message,
    RescheduleOutcome,
    Scheduled,
)
from tickwheel.client.credentials import open_channel
from tickwheel.harness.local_cluster import LocalCluster, LocalNode, wait_for
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.v1 import tickwheel_pb2_grpc as pb_grpc

DAY_MS = 86_400_000






def follower(cluster: LocalCluster) -> LocalNode:
    leader = cluster.leader()
    return next(node for node in cluster.nodes if node is not leader)


def receive(client: Client, name: str, count: int, **options: object) -> list:
    """The first ``count`` messages of topic ``name``, acknowledged."""
    got = []
    with client.consume(name, **options) as consumer:
        for message in consumer:
            got.append(message)
            message.ack()
            if len(got) == count:
                break
    return got


@pytest.mark.cluster
def test_scheduled_messages_arrive_once_on_time_and_acks_move_the_cursor(
        cluster: LocalCluster, client: Client) -> None:
    name = topic()
    due_ms = now_ms() + 1_000
    results = client.schedule_many([Message(name, f"body-{i}".encode(), deliver_at_ms=due_ms + i,
                                            id=f"m-{i}", properties={"n": str(i)})
                                    for i in range(200)])
    assert [r.id for r in results] == [f"m-{i}" for i in range(200)]
    got = receive(client, name, 200)
    assert sorted(m.id for m in got) == sorted(r.id for r in results)
    first = next(m for m in got if m.id == "m-7")
    assert (first.body, first.properties, first.attempt) == (b"body-7", {"n": "7"}, 1)
    assert all(m.delivered_at_ms >= m.deliver_at_ms for m in got)
    leader = cluster.leader()
    last_second = (due_ms + 199) // 1000
    in_last_second = sum(1 for i in range(200) if (due_ms + i) // 1000 == last_second)
    wait_for(lambda: (leader.info().cursor_second, leader.info().cursor_local_index)
             >= (last_second, in_last_second), 10,
             "the cursor to pass the acknowledged messages")


@pytest.mark.cluster
def test_an_unacknowledged_message_comes_back_after_the_visibility_timeout(
        client: Client) -> None:
    name = topic()
    client.schedule(name, b"again", delay_ms=0, id="once")
    attempts = []
    with client.consume(name, visibility_timeout_ms=300) as consumer:
        for message in consumer:
            attempts.append((message.id, message.attempt, message.receipt))
            if message.attempt == 2:
                message.ack()
                break
    assert [(i, a) for i, a, _ in attempts] == [("once", 1), ("once", 2)]


@pytest.mark.cluster
def test_a_message_whose_consumer_disconnects_goes_to_another_consumer(
        client: Client) -> None:
    name = topic()
    client.schedule(name, b"x", delay_ms=0, id="handed-over")
    first = client.consume(name, visibility_timeout_ms=60_000)
    assert next(first).attempt == 1
    first.close()
    (again,) = receive(client, name, 1)
    assert (again.id, again.attempt) == ("handed-over", 2)


@pytest.mark.cluster
def test_a_cancelled_message_is_never_delivered(client: Client) -> None:
    name = topic()
    due_ms = now_ms() + 1_500
    gone = client.schedule(name, b"gone", deliver_at_ms=due_ms, id="gone")
    client.schedule(name, b"marker", deliver_at_ms=due_ms + 300, id="marker")
    assert client.cancel_outcomes([gone.handle]) == [CancelOutcome.CANCELLED]
    # Idempotent: a repeat (a retry whose first answer was lost) says it is cancelled.
    assert client.cancel_outcomes([gone.handle]) == [CancelOutcome.ALREADY_CANCELLED]
    assert client.cancel(gone.handle) is True
    (first,) = receive(client, name, 1)
    assert first.id == "marker"


@pytest.mark.cluster
def test_a_retried_id_is_scheduled_once_and_answers_with_its_first_result(
        client: Client) -> None:
    name = topic()
    first = client.schedule(name, b"a", delay_ms=DAY_MS, id="same-id")
    again = client.schedule(name, b"a", delay_ms=DAY_MS, id="same-id")
    assert (again.duplicate, again.handle, again.deliver_at_ms) == (
        True, first.handle, first.deliver_at_ms)


BAD_MESSAGES = [
    ("messages[0].topic", {"topic": ""}),
    ("messages[0].topic", {"topic": "has space"}),
    ("messages[0].topic", {"topic": "x" * 250}),
    ("messages[0].body", {"body": b"b" * ((4 << 20) + 1)}),
    ("messages[0].deliver_at_ms", {"deliver_at_ms": 1, "delay_ms": 1}),
    ("messages[0].deliver_at_ms", {"delay_ms": None}),
    ("messages[0].deliver_at_ms", {"deliver_at_ms": -5, "delay_ms": None}),
    ("messages[0].delay_ms", {"delay_ms": 367 * DAY_MS}),
    ("messages[0].delay_ms", {"delay_ms": -1}),
    ("messages[0].deliver_at_ms", {"deliver_at_ms": 4_102_444_800_000, "delay_ms": None}),
    ("messages[0].properties", {"properties": {f"k{i}": "v" for i in range(65)}}),
    ("messages[0].properties", {"properties": {"k": "v" * (64 << 10)}}),
    ("messages[0].id", {"id": "i" * 257}),
    ("messages[0].delay_level", {"delay_level": 0, "delay_ms": None}),
    ("messages[0].delay_level", {"delay_level": -3, "delay_ms": None}),
    ("messages[0].deliver_at_ms", {"delay_level": 3}),
    ("messages[0].topic", {"topic": "%DLQ%orders"}),
]


@pytest.mark.cluster
@pytest.mark.parametrize(("field", "change"), BAD_MESSAGES,
                         ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD_MESSAGES)])
def test_bad_input_is_invalid_argument_naming_the_field_and_nothing_is_written(
        cluster: LocalCluster, field: str, change: dict) -> None:
    name = topic()
    fields = {"id": uuid.uuid4().hex, "topic": name, "body": b"ok", "delay_ms": 60_000,
              **change}
    good = pb.Message(id=f"good-{uuid.uuid4().hex}", topic=name, body=b"ok", delay_ms=60_000)
    bad = pb.Message(**{k: v for k, v in fields.items() if v is not None})
    stub = follower(cluster).stub
    with pytest.raises(grpc.RpcError) as caught:
        stub.Schedule(pb.ScheduleRequest(messages=[bad, good]), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith(f"{field}:"), caught.value.details()
    (result,) = cluster.schedule([good]).results
    assert not result.duplicate  # the good message of the rejected request was not written


@pytest.mark.cluster
def test_schedule_calls_from_many_threads_share_requests_and_each_gets_its_own_answer(
        cluster: LocalCluster, client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """An order service calls ``schedule`` from each of its request threads. The calls share
    requests (`tickwheel.client.coalescing`), each answered with its own message's result;
    a bad message among them fails its own call alone, with its field as if sent alone."""
    name = topic()
    requests: list[int] = []
    send = client._coalescer._send

    def counted(messages: list[Message]) -> list[Scheduled]:
        requests.append(len(messages))
        return send(messages)
    monkeypatch.setattr(client._coalescer, "_send", counted)

    def call(i: int) -> Scheduled | InvalidArgument:
        try:
            return client.schedule(name if i % 10 else "bad topic!", b"x", delay_ms=DAY_MS,
                                   id=f"{name}-{i}")
        except InvalidArgument as error:
            return error
    with ThreadPoolExecutor(16) as pool:
        good = list(pool.map(call, range(1, 321, 10)))  # none bad: how requests are shared
    assert [getattr(g, "id", g) for g in good] == [f"{name}-{i}" for i in range(1, 321, 10)]
    assert len(requests) < len(good) // 2, requests
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(call, range(1, 321)))
    refused = [i for i, g in enumerate(got, 1) if isinstance(g, InvalidArgument)]
    assert refused == list(range(10, 321, 10))
    assert {g.field for g in got if isinstance(g, InvalidArgument)} == {"messages[0].topic"}
    answered = [g for g in got if isinstance(g, Scheduled)]
    assert [s.id for s in answered] == [f"{name}-{i}" for i in range(1, 321) if i % 10]
    assert [s.duplicate for s in answered] == [i % 10 == 1 for i in range(1, 321) if i % 10]
    assert len({s.handle for s in answered}) == len(answered)
    wait_for(lambda: (pending_of(cluster.leader()) or {}).get(name) == len(answered), 20,
             f"{len(answered)} messages pending in {name}")


@pytest.mark.cluster
def test_the_client_library_raises_invalid_argument_with_the_field(client: Client) -> None:
    with pytest.raises(InvalidArgument) as caught:
        client.schedule("bad topic!", b"x", delay_ms=1)
    assert caught.value.field == "messages[0].topic"


@pytest.mark.cluster
@pytest.mark.parametrize(("field", "first"), [
    ("subscribe", pb.ReceiveRequest(credit=pb.Credit(credits=1))),
    ("subscribe.topic", pb.ReceiveRequest(subscribe=pb.Subscribe(topic="", credits=1))),
    ("subscribe.credits", pb.ReceiveRequest(subscribe=pb.Subscribe(topic="t",
                                                                   credits=10_001))),
    ("subscribe.visibility_timeout_ms", pb.ReceiveRequest(subscribe=pb.Subscribe(
        topic="t", credits=1, visibility_timeout_ms=5))),
])
def test_a_bad_subscription_is_invalid_argument_naming_the_field(
        cluster: LocalCluster, field: str, first: pb.ReceiveRequest) -> None:
    stream = cluster.leader().stub.Receive(iter([first]), timeout=10)
    with pytest.raises(grpc.RpcError) as caught:
        next(stream)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith(f"{field}:"), caught.value.details()


def not_utf8(request: Message) -> bytes:
    """``request`` on the wire with its one "é" (two bytes) swapped for two bytes that are not
    UTF-8: every length prefix still holds, so only that string fails to decode."""
    wire = request.SerializeToString()
    assert wire.count("é".encode()) == 1
    return wire.replace("é".encode(), b"\xff\xfe")


TRUNCATED = b"\x08"
"""Field 1, a varint, and then nothing: no message type decodes it."""
SUBSCRIBED = pb.ReceiveRequest(subscribe=pb.Subscribe(topic="undecodable", credits=1))
UNDECODABLE = [  # the method, and what one call sends it: its last request does not decode
    ("Schedule", [not_utf8(pb.ScheduleRequest(messages=[pb.Message(
        id="é", topic="undecodable", body=b"x", delay_ms=DAY_MS)]))]),
    ("ScheduleStream", [pb.ScheduleRequest(messages=[pb.Message(
        topic="undecodable", body=b"x", delay_ms=DAY_MS)]).SerializeToString(),
        not_utf8(pb.ScheduleRequest(messages=[pb.Message(
            topic="é", body=b"x", delay_ms=DAY_MS)]))]),
    ("Cancel", [TRUNCATED]),
    ("ClusterInfo", [TRUNCATED]),
    ("Receive", [not_utf8(pb.ReceiveRequest(subscribe=pb.Subscribe(topic="é", credits=1)))]),
    ("Receive", [SUBSCRIBED.SerializeToString(),
                 not_utf8(pb.ReceiveRequest(ack=pb.Ack(receipts=["é"])))]),
]


@pytest.mark.cluster
@pytest.mark.parametrize("on", ["leader", "follower"])
@pytest.mark.parametrize(("method", "requests"), UNDECODABLE,
                         ids=["Schedule", "ScheduleStream", "Cancel", "ClusterInfo",
                              "Receive-subscribe", "Receive-ack"])
def test_a_request_that_does_not_decode_is_invalid_argument(
        cluster: LocalCluster, on: str, method: str, requests: list[bytes]) -> None:
    """grpcio answers UNKNOWN for whatever a request deserializer raises (and logs it with a
    traceback); the bytes go out as they are, no serializer."""
    node = cluster.leader() if on == "leader" else follower(cluster)
    rpc = pb.DESCRIPTOR.services_by_name["Tickwheel"].methods_by_name[method]
    path = f"/{rpc.containing_service.full_name}/{method}"
    with open_channel(node.grpc_address, cluster.credentials(), ()) as channel, \
            pytest.raises(grpc.RpcError) as caught:
        if not rpc.client_streaming:
            channel.unary_unary(path)(requests[0], timeout=10)
        elif not rpc.server_streaming:
            channel.stream_unary(path)(iter(requests), timeout=10)
        else:
            closed = threading.Event()

            def held_open() -> Iterator[bytes]:
                yield from requests
                closed.wait(10)
            stream = channel.stream_stream(path)(held_open(), timeout=10)
            stream.add_done_callback(lambda _: closed.set())
            next(stream)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert caught.value.details().startswith("request: could not be decoded"), (
        caught.value.details())


@pytest.mark.cluster
def test_a_follower_forwards_every_call_and_names_the_leader(cluster: LocalCluster) -> None:
    leader, other = cluster.leader(), follower(cluster)
    name = topic()
    response, call = other.stub.Schedule.with_call(pb.ScheduleRequest(messages=[
        pb.Message(id="fwd", topic=name, body=b"via follower", delay_ms=0)]), timeout=10)
    assert dict(call.trailing_metadata())["tickwheel-leader"] == leader.grpc_address
    assert response.results[0].id == "fwd"
    streamed = other.stub.ScheduleStream(iter([pb.ScheduleRequest(messages=[
        pb.Message(id=f"s-{i}", topic=name, body=b"s", delay_ms=DAY_MS)]) for i in range(3)]),
        timeout=10)
    assert [r.id for r in streamed.results] == ["s-0", "s-1", "s-2"]
    cancelled = other.stub.Cancel(pb.CancelRequest(handles=[streamed.results[0].handle]),
                                  timeout=10)
    assert list(cancelled.cancelled) == [True]
    acked = threading.Event()

    def requests() -> Iterator[pb.ReceiveRequest]:
        yield pb.ReceiveRequest(subscribe=pb.Subscribe(topic=name, credits=1))
        acked.wait(10)
    stream = other.stub.Receive(requests(), timeout=10)
    message = next(stream).messages[0]
    acked.set()
    stream.cancel()
    assert (message.id, message.body) == ("fwd", b"via follower")


@pytest.mark.cluster
def test_overload_is_resource_exhausted_and_writes_nothing(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, size=1, extra_args=("--max-queued-msgs", "1")) as single:
        stub = single.leader().stub

        def attempt(i: int) -> tuple[grpc.StatusCode | None, list[pb.Message]]:
            batch = [pb.Message(id=f"o-{i}-{j}", topic="o", body=b"x", delay_ms=DAY_MS)
                     for j in range(20)]
            try:
                stub.Schedule(pb.ScheduleRequest(messages=batch), timeout=10)
            except grpc.RpcError as error:
                return error.code(), batch
            return None, batch
        with ThreadPoolExecutor(16) as pool:
            for round_number in range(50):
                outcomes = list(pool.map(attempt, range(16 * round_number,
                                                        16 * round_number + 16)))
                refused = [batch for code, batch in outcomes
                           if code == grpc.StatusCode.RESOURCE_EXHAUSTED]
                if refused:
                    break
        assert refused, "16 concurrent requests against a queue of 1 never overloaded it"
        assert {code for code, _ in outcomes} <= {None, grpc.StatusCode.RESOURCE_EXHAUSTED}
        again = single.schedule(refused[0])
        assert not any(r.duplicate for r in again.results)


@pytest.mark.cluster
def test_a_schedule_stream_answers_in_order_and_refuses_past_its_cap(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, size=1, extra_args=("--max-stream-msgs", "300")) as single:
        stub = single.leader().stub
        requests = [pb.ScheduleRequest(messages=[pb.Message(
            id=f"st-{i}", topic="st", body=b"x", delay_ms=DAY_MS)]) for i in range(300)]
        response = stub.ScheduleStream(iter(requests), timeout=30)
        assert [r.id for r in response.results] == [f"st-{i}" for i in range(300)]
        assert len({r.handle for r in response.results}) == 300
        with pytest.raises(grpc.RpcError) as caught:
            stub.ScheduleStream(iter(requests + requests[:1]), timeout=30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.details().startswith("messages: a stream carries at most 300")


@pytest.mark.cluster
def test_health_serves_once_there_is_a_leader_and_reflection_lists_the_api(
        cluster: LocalCluster) -> None:
    node = follower(cluster)
    with open_channel(node.grpc_address, cluster.credentials(), ()) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "tickwheel.v1.Tickwheel"):
            wait_for(lambda service=service: health.Check(health_pb2.HealthCheckRequest(
                service=service), timeout=5).status == health_pb2.HealthCheckResponse.SERVING,
                10, "health SERVING")
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        (answer,) = reflection.ServerReflectionInfo(iter([
            reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
        names = {s.name for s in answer.list_services_response.service}
    assert {"tickwheel.v1.Tickwheel", "grpc.health.v1.Health"} <= names


@pytest.mark.cluster
def test_cluster_info_lists_members_and_what_waits_per_topic(
        cluster: LocalCluster, client: Client) -> None:
    name = topic()
    client.schedule(name, b"x", delay_ms=0, id="waiting")
    leader = cluster.leader()

    def waiting() -> pb.ClusterInfoResponse | None:
        info = leader.info()
        return info if any(t.topic == name and t.ready == 1 for t in info.topics) else None
    info = wait_for(waiting, 10, "the message to wait in its topic's ready queue")
    assert {m.grpc_address for m in info.members} == {n.grpc_address for n in cluster.nodes}
    assert info.leader_grpc == leader.grpc_address
    assert sorted(m.role for m in info.members) == ["follower", "follower", "leader"]
    assert all(m.connected and m.lag_entries >= 0 for m in info.members)
    assert receive(client, name, 1)[0].id == "waiting"


@pytest.mark.cluster
def test_the_asyncio_client_schedules_reschedules_consumes_and_cancels(
        cluster: LocalCluster) -> None:
    name = topic()

    async def run() -> tuple[list[tuple[str, int]], bool]:
        async with AsyncClient([n.grpc_address for n in cluster.nodes],
                               credentials=cluster.credentials()) as client:
            later = await client.schedule(name, b"later", delay_ms=DAY_MS)
            await client.schedule(name, b"now", delay_ms=0, id="a-4")
            handles = [r.handle for r in await client.schedule_many(
                [Message(name, b"now", delay_ms=DAY_MS, id=f"a-{i}") for i in range(4)])]
            moved = await client.reschedule(handles, delay_ms=0)
            assert {r.outcome for r in moved} == {RescheduleOutcome.RESCHEDULED}
            got = []
            async with client.consume(name) as consumer:
                async for message in consumer:
                    got.append((message.id, message.attempt))
                    message.ack()
                    if len(got) == 5:
                        break
            return got, await client.cancel(later.handle)
    got, cancelled = asyncio.run(run())
    assert sorted(got) == [(f"a-{i}", 1) for i in range(5)]
    assert cancelled


@pytest.mark.cluster
def test_the_client_retries_across_a_leader_kill_without_scheduling_twice(
        tmp_path: Path) -> None:
    with LocalCluster(tmp_path) as fresh, fresh.client(timeout_s=60) as client:
        old = fresh.leader()
        cancelled = client.schedule("c", b"x", delay_ms=DAY_MS, id="cancelled-before-kill")
        assert client.cancel_outcomes([cancelled.handle]) == [CancelOutcome.CANCELLED]
        due_ms = now_ms() + 12_000  # after the takeover plus the skew allowance: no flag
        batches = [[Message("k", b"x", deliver_at_ms=due_ms + i, id=f"k-{b}-{i}")
                    for i in range(50)] for b in range(40)]
        results, killed = [], threading.Event()

        def produce() -> None:
            for number, batch in enumerate(batches):
                if number == 10:
                    killed.wait(10)
                results.extend(client.schedule_many(batch))
        producer = threading.Thread(target=produce)
        producer.start()
        wait_for(lambda: len(results) >= 500, 20, "ten batches scheduled")
        fresh.signal(old, signal.SIGKILL)
        killed.set()
        producer.join(60)
        assert len(results) == 2_000
        # The new leader knows the tombstone: a cancel retried across the kill tells the truth.
        assert client.cancel_outcomes([cancelled.handle]) == [CancelOutcome.ALREADY_CANCELLED]
        got = receive(client, "k", 2_000, prefetch=500)
    counts = Counter(m.id for m in got)
    assert set(counts) == {m.id for batch in batches for m in batch}
    assert max(counts.values()) == 1
    assert not any(m.possible_duplicate for m in got)


@pytest.mark.cluster
def test_shared_schedule_requests_cut_by_a_leader_kill_answer_every_call_once(
        tmp_path: Path) -> None:
    """Threads calling ``schedule`` while the leader is killed: requests shared by several
    calls are cut and retried on the new leader. Every call gets its own message's answer,
    each message is stored once and delivered once, unflagged."""
    threads, calls = 8, 60
    with LocalCluster(tmp_path) as fresh, fresh.client(timeout_s=60) as client:
        old = fresh.leader()
        due_ms = now_ms() + 12_000  # after the takeover plus the skew allowance: no flag
        answers: dict[str, Scheduled] = {}
        killed = threading.Event()

        def produce(thread: int) -> None:
            for i in range(calls):
                if i == calls // 4:
                    killed.wait(10)
                id_ = f"t-{thread}-{i}"
                answers[id_] = client.schedule("t", b"x", deliver_at_ms=due_ms + i, id=id_)
        with ThreadPoolExecutor(threads) as pool:
            running = [pool.submit(produce, t) for t in range(threads)]
            wait_for(lambda: len(answers) >= threads * calls // 5, 20, "a fifth answered")
            fresh.signal(old, signal.SIGKILL)
            killed.set()
            for future in running:
                future.result(60)
        assert sorted(answers) == sorted(f"t-{t}-{i}" for t in range(threads)
                                         for i in range(calls))
        assert all(answer.id == id_ for id_, answer in answers.items())
        assert len({answer.handle for answer in answers.values()}) == threads * calls
        got = receive(client, "t", threads * calls, prefetch=500)
    counts = Counter(m.id for m in got)
    assert set(counts) == set(answers) and max(counts.values()) == 1
    assert not any(m.possible_duplicate for m in got)
    assert {m.id: m.handle for m in got} == {id_: a.handle for id_, a in answers.items()}


@pytest.mark.cluster
def test_a_new_leader_flags_exactly_the_leases_left_unacknowledged(tmp_path: Path) -> None:
    """One message stays unacknowledged when the leader is killed; the 19 acknowledged after
    it are done in the log. The new leader re-sends only the one, flagged (its lease was
    committed); what comes due after the takeover, and 1,000 messages already past due, are
    first deliveries and arrive unflagged (the first version flagged everything due within
    two seconds of a takeover, and every past-due message on a fresh cluster)."""
    with LocalCluster(tmp_path) as fresh, fresh.client(timeout_s=60) as client:
        old = fresh.leader()
        start_ms = now_ms()
        overdue = client.schedule_many([Message("late", b"x", deliver_at_ms=start_ms - 60_000,
                                                id=f"late-{i}") for i in range(1_000)])
        assert len(overdue) == 1_000
        client.schedule_many([Message("held", b"x", deliver_at_ms=start_ms + i, id=f"h-{i}")
                              for i in range(20)])
        with client.consume("held", prefetch=20, visibility_timeout_ms=60_000) as consumer:
            got = [message for _, message in zip(range(20), consumer, strict=False)]
            assert [m.id for m in got] == [f"h-{i}" for i in range(20)]
            assert not any(m.possible_duplicate for m in got)
            for message in got[1:]:
                message.ack()
            survivor = next(n for n in fresh.nodes if n is not old)

            def leased() -> list[int]:
                return [g.leased for g in client.cluster_info(survivor.grpc_address).groups
                        if g.topic == "held"]
            wait_for(lambda: leased() == [1], 10, "the 19 acks replicated to a follower")
            fresh.signal(old, signal.SIGKILL)
        client.schedule("held", b"marker", delay_ms=0, id="marker")
        again = receive(client, "held", 2)
        late = receive(client, "late", 1_000)
    assert sorted((m.id, m.possible_duplicate) for m in again) == [("h-0", True),
                                                                  ("marker", False)]
    assert len({m.id for m in late}) == 1_000
    assert not any(m.possible_duplicate for m in late)


@pytest.mark.cluster
def test_a_consumer_survives_its_node_stopping_gracefully(tmp_path: Path) -> None:
    """SIGTERM (a rolling restart) stops the node's server with a grace period, after which
    the streams still open are cut (gRPC says UNAVAILABLE here): the consumer reconnects to
    the new leader and goes on."""
    with LocalCluster(tmp_path) as fresh, fresh.client(timeout_s=60) as client:
        old = fresh.leader()
        client.schedule("g", b"x", delay_ms=0, id="before")
        with client.consume("g", prefetch=8) as consumer:
            messages = iter(consumer)
            first = next(messages)
            first.ack()
            fresh.signal(old, signal.SIGTERM)
            wait_for(lambda: old.process.poll() is not None, 30, "the leader to stop")
            client.schedule("g", b"x", delay_ms=0, id="after")
            second = next(messages)
    assert (first.id, second.id) == ("before", "after")


@pytest.mark.parametrize(("code", "details"), [
    (grpc.StatusCode.CANCELLED, "CANCELLED"),
    (grpc.StatusCode.INTERNAL, "Internal error from Core"),
])
def test_a_consumer_reconnects_when_its_stream_is_cut(code: grpc.StatusCode,
                                                      details: str) -> None:
    """A 10-minute chaos run ended both of its steady consumers with CANCELLED at a node's
    graceful restart, and a leader's SIGKILL once ended one with gRPC's own ``INTERNAL:
    Internal error from Core`` (a connection torn mid-stream): the library retried only
    UNAVAILABLE and its like. A real gRPC server here ends the first stream so and serves the
    second."""
    class Cancelling(pb_grpc.TickwheelServicer):
        streams = 0

        def Receive(self, request_iterator: Iterator[pb.ReceiveRequest],
                    context: grpc.ServicerContext) -> Iterator[pb.ReceiveResponse]:
            next(request_iterator)  # the subscription
            self.streams += 1
            if self.streams == 1:
                context.abort(code, details)
            yield pb.ReceiveResponse(messages=[pb.Delivered(id="after", topic="t", receipt="r")])
            for _ in request_iterator:  # until the consumer closes its side
                pass

    servicer, server = Cancelling(), grpc.server(ThreadPoolExecutor(4))
    pb_grpc.add_TickwheelServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with Client(f"127.0.0.1:{port}", timeout_s=10,
                    credentials=Credentials(insecure=True)) as client, client.consume(
                "t") as consumer:
            assert next(iter(consumer)).id == "after"
        assert servicer.streams == 2
    finally:
        server.stop(None)


def pending_of(node: LocalNode) -> dict[str, int] | None:
    info = node.info()
    return None if info is None else {p.topic: p.pending for p in info.pending}


def wait_pending(nodes: list[LocalNode], expected: dict[str, int], what: str) -> None:
    try:
        wait_for(lambda: all(pending_of(node) == expected for node in nodes), 20,
                 f"every node to count {expected} pending ({what})")
    except TimeoutError as error:  # what each node counted instead, and where it stood
        raise AssertionError(f"{error}: {[(n.raft, pending_of(n), n.info()) for n in nodes]}"
                             ) from None


@pytest.mark.cluster
def test_pending_per_topic_is_replicated_falls_with_cancels_and_acks_and_survives_restarts(
        tmp_path: Path) -> None:
    with LocalCluster(tmp_path, extra_args=("--snapshot-min-entries", "20"),
                      metrics=True) as fresh, fresh.client(timeout_s=30) as client:
        fresh.leader()
        soon_ms, later_ms = now_ms() + 1_500, now_ms() + DAY_MS
        handles = {}
        for name, soon, later in (("pa", 10, 30), ("pb", 5, 20)):
            client.schedule_many([Message(name, b"x", deliver_at_ms=soon_ms + i,
                                          id=f"{name}-soon-{i}") for i in range(soon)])
            handles[name] = [client.schedule(name, b"y", deliver_at_ms=later_ms + i,
                                             id=f"{name}-later-{i}").handle
                             for i in range(later)]
        wait_pending(fresh.nodes, {"pa": 40, "pb": 25}, "scheduled")
        for handle in handles["pa"][:5] + handles["pb"][:3]:
            assert client.cancel(handle) is True
        wait_pending(fresh.nodes, {"pa": 35, "pb": 22}, "cancelled")
        assert len(receive(client, "pa", 10)) == 10 and len(receive(client, "pb", 5)) == 5
        wait_pending(fresh.nodes, {"pa": 25, "pb": 17}, "delivered and acknowledged")
        url = f"http://{follower(fresh).metrics_address}/metrics"
        wait_for(lambda: 'tickwheel_pending_messages{topic="pa"} 25.0' in urllib.request.urlopen(
            url, timeout=5).read().decode(), 5, "the pending gauge on a follower")

        wait_for(lambda: all((n.data / "raft" / "snapshot").exists() for n in fresh.nodes),
                 15, "a snapshot on every node")
        assert client.cancel(handles["pa"][5]) is True  # after the snapshot: journal replay
        wait_pending(fresh.nodes, {"pa": 24, "pb": 17}, "one more cancel")
        fresh.stop_all()
        for node in fresh.nodes:
            fresh.start(node)
        fresh.leader(30)
        wait_pending(fresh.nodes, {"pa": 24, "pb": 17}, "after a restart of every node")

        wiped = follower(fresh)
        fresh.stop(wiped)
        shutil.rmtree(wiped.data)
        fresh.start(wiped)
        wait_pending(fresh.nodes, {"pa": 24, "pb": 17}, "on a wiped follower, from a snapshot")


def _due_over_120_ms(client: Client, name: str, count: int = 60) -> int:
    """Schedules ``count`` messages of topic ``name`` due 2 ms apart from 1.5 s on: the
    leader grants a step's messages up to 30 ms ahead. Returns the first due time."""
    first_ms = now_ms() + 1_500
    client.schedule_many(Message(name, b"x", deliver_at_ms=first_ms + 2 * i, id=f"{name}-{i}")
                         for i in range(count))
    return first_ms


@pytest.mark.cluster
def test_only_a_stream_that_holds_gets_messages_before_they_are_due(
        cluster: LocalCluster, client: Client) -> None:
    """Two raw streams, in two groups of one topic. The one that did not subscribe with
    ``hold`` (an older client, or one that hands messages out at once) never gets a message
    before it is due. The one that did gets messages ahead, each with ``hold_ms``:
    ``delivered_at_ms`` is the end of the hold, counted from when the leader sent it."""
    name = topic()
    for group in ("plain", "holding"):
        client.create_group(name, group)
    arrived: dict[str, list[tuple[int, int, pb.Delivered]]] = {"plain": [], "holding": []}
    done = threading.Event()

    def read(group: str) -> None:
        def requests() -> Iterator[pb.ReceiveRequest]:
            yield pb.ReceiveRequest(subscribe=pb.Subscribe(
                topic=name, group=group, credits=100, hold=group == "holding"))
            done.wait(30)
        for response_number, response in enumerate(
                cluster.leader().stub.Receive(requests(), timeout=30)):
            arrived_ms = now_ms()
            arrived[group] += [(response_number, arrived_ms, m) for m in response.messages]
            if len(arrived[group]) >= 60:
                return
    readers = [threading.Thread(target=read, args=(group,)) for group in arrived]
    for reader in readers:
        reader.start()
    wait_for(lambda: client.cluster_info() is not None and sum(
        g.consumers for g in client.cluster_info().groups if g.topic == name) == 2, 10,
        "both streams to subscribe")
    _due_over_120_ms(client, name)
    for reader in readers:
        reader.join(30)
    done.set()
    plain, holding = arrived["plain"], arrived["holding"]
    assert len(plain) == len(holding) == 60
    for _, arrived_ms, message in plain:
        assert message.hold_ms == 0
        assert arrived_ms >= message.delivered_at_ms >= message.deliver_at_ms
    ahead = [(arrived_ms, m) for _, arrived_ms, m in holding if m.hold_ms]
    assert any(arrived_ms < m.deliver_at_ms for arrived_ms, m in ahead), \
        "the leader sent nothing ahead to the stream that holds"
    for arrived_ms, message in ahead:
        assert message.delivered_at_ms >= message.deliver_at_ms
        assert message.delivered_at_ms - message.hold_ms <= arrived_ms  # counted from the send
    assert len({n for n, _, _ in holding}) < len({n for n, _, _ in plain})


def _taken_sync(client: Client, name: str) -> list[tuple[int, int]]:
    """When the blocking consumer handed out each of `_due_over_120_ms`'s messages, and its
    due time."""
    taken = []
    with client.consume(name) as consumer:
        _due_over_120_ms(client, name)
        for message in consumer:
            taken.append((now_ms(), message.deliver_at_ms))
            message.ack()
            if len(taken) == 60:
                break
    return taken


async def _taken_async(cluster: LocalCluster, client: Client, name: str
                       ) -> list[tuple[int, int]]:
    """`_taken_sync` for the asyncio consumer."""
    taken = []
    async with AsyncClient([n.grpc_address for n in cluster.nodes],
                           credentials=cluster.credentials()) as aclient, \
            aclient.consume(name) as consumer:
        await asyncio.to_thread(_due_over_120_ms, client, name)
        async for message in consumer:
            taken.append((now_ms(), message.deliver_at_ms))
            message.ack()
            if len(taken) == 60:
                break
    return taken


@pytest.mark.cluster
@pytest.mark.parametrize("kind", ["sync", "asyncio"])
def test_a_library_consumer_hands_out_no_message_before_it_is_due(
        cluster: LocalCluster, client: Client, kind: str) -> None:
    """The library's consumers subscribe with ``hold`` and get messages ahead of their due
    time: neither hands one to the application early."""
    name = topic()
    taken = (_taken_sync(client, name) if kind == "sync"
             else asyncio.run(_taken_async(cluster, client, name)))
    assert len(taken) == 60
    assert [(at, due) for at, due in taken if at < due] == []
