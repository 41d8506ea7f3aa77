"""RocketMQ's protocol spoken by hand (tickwheel's own copy of the stubs), the way a hostile or
careless client would: unsigned and forged calls, a principal without grants, seconds given as
milliseconds, SQL filters, forged and replayed receipts, bytes that are no request, and the
RPCs tickwheel does not serve. Each refusal is a RocketMQ status and changes nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from rocketmqtests import TOPIC, delay_message, signed

from tickwheel.harness.local_cluster import LocalCluster
from tickwheel.rocketmq.v2 import definition_pb2 as rmq
from tickwheel.rocketmq.v2 import service_pb2 as svc
from tickwheel.rocketmq.v2 import service_pb2_grpc as svc_grpc

pytestmark = pytest.mark.cluster

Code = rmq.Code


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("rocketmq-protocol")
    principals = {"reader": [{"actions": ["consume"], "topics": ["elsewhere"]}]}
    with LocalCluster(root, 3, rocketmq=True, principals=principals) as made:
        made.leader(timeout_s=30)
        yield made


@pytest.fixture(scope="module")
def channel(cluster: LocalCluster) -> Iterator[grpc.Channel]:
    assert cluster.security is not None and cluster.nodes[0].rocketmq_address is not None
    credentials = grpc.ssl_channel_credentials(cluster.security.ca_file.read_bytes())
    with grpc.secure_channel(cluster.nodes[0].rocketmq_address, credentials) as opened:
        yield opened


def test_unsigned_forged_and_ungranted_calls_are_refused(cluster: LocalCluster,
                                                         channel: grpc.Channel) -> None:
    stub = svc_grpc.MessagingServiceStub(channel)
    route = svc.QueryRouteRequest(topic=rmq.Resource(name=TOPIC))
    # refused by the listener's gate before the request is read, as gRPC's UNAUTHENTICATED
    for metadata in ((), signed(cluster, key="not-the-secret-key"),
                     signed(cluster, access_key="nobody")):
        with pytest.raises(grpc.RpcError) as caught:
            stub.QueryRoute(route, metadata=metadata)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    reader = signed(cluster, access_key="reader")
    assert stub.QueryRoute(route, metadata=reader).status.code == Code.FORBIDDEN
    send = svc.SendMessageRequest(messages=[delay_message(int(time.time()) + 60)])
    assert stub.SendMessage(send, metadata=reader).status.code == Code.FORBIDDEN
    answer = stub.QueryRoute(route, metadata=signed(cluster))
    assert answer.status.code == Code.ILLEGAL_ACCESS_POINT  # no endpoints asked, none set
    asked = rmq.Endpoints(scheme=rmq.AddressScheme.DOMAIN_NAME,
                          addresses=[rmq.Address(host="tickwheel.example", port=8081)])
    route.endpoints.CopyFrom(asked)
    answer = stub.QueryRoute(route, metadata=signed(cluster))
    assert answer.status.code == Code.OK
    [queue] = answer.message_queues
    assert queue.broker.id == 0 and queue.permission == rmq.Permission.READ_WRITE
    assert queue.broker.endpoints == asked  # the address the client reached the cluster at
    assert set(queue.accept_message_types) == {rmq.MessageType.NORMAL, rmq.MessageType.DELAY}


def test_a_time_in_milliseconds_an_sql_filter_and_bad_bytes_are_refused(
        cluster: LocalCluster, channel: grpc.Channel) -> None:
    stub = svc_grpc.MessagingServiceStub(channel)
    metadata = signed(cluster)
    milliseconds = svc.SendMessageRequest(messages=[delay_message(int(time.time() * 1000))])
    answer = stub.SendMessage(milliseconds, metadata=metadata)
    assert answer.status.code == Code.ILLEGAL_DELIVERY_TIME
    assert "not milliseconds" in answer.status.message
    fifo = delay_message(int(time.time()) + 5)
    fifo.system_properties.message_group = "g"
    assert stub.SendMessage(svc.SendMessageRequest(messages=[fifo]),
                            metadata=metadata).status.code == Code.UNSUPPORTED
    receive = svc.ReceiveMessageRequest(
        group=rmq.Resource(name="g"), message_queue=rmq.MessageQueue(
            topic=rmq.Resource(name=TOPIC)), batch_size=1, filter_expression=
        rmq.FilterExpression(type=rmq.FilterType.SQL, expression="a > 1"))
    [status] = list(stub.ReceiveMessage(receive, metadata=metadata))
    assert status.status.code == Code.ILLEGAL_FILTER_EXPRESSION
    raw = channel.unary_unary("/apache.rocketmq.v2.MessagingService/SendMessage")
    answer = svc.SendMessageResponse.FromString(raw(b"\xff\xff\xff", metadata=metadata))
    assert answer.status.code == Code.BAD_REQUEST
    offsets = stub.GetOffset(svc.GetOffsetRequest(), metadata=metadata)
    assert offsets.status.code == Code.UNSUPPORTED


def test_forged_and_settled_receipts_change_nothing(cluster: LocalCluster,
                                                    channel: grpc.Channel) -> None:
    stub = svc_grpc.MessagingServiceStub(channel)
    metadata = signed(cluster)
    group = rmq.Resource(name="forgery")
    # the group exists before the message comes due: it is kept for it
    list(stub.ReceiveMessage(svc.ReceiveMessageRequest(
        group=group, message_queue=rmq.MessageQueue(topic=rmq.Resource(name=TOPIC)),
        batch_size=1, invisible_duration=svc.google_dot_protobuf_dot_duration__pb2.Duration(
            seconds=30)), metadata=metadata))
    sent = stub.SendMessage(svc.SendMessageRequest(messages=[delay_message(0, b"real")]),
                            metadata=metadata)
    assert sent.status.code == Code.OK
    request = svc.ReceiveMessageRequest(
        group=group, message_queue=rmq.MessageQueue(topic=rmq.Resource(name=TOPIC)),
        batch_size=1, invisible_duration=svc.google_dot_protobuf_dot_duration__pb2.Duration(
            seconds=30))
    answers = list(stub.ReceiveMessage(request, metadata=metadata, timeout=25))
    assert answers[0].status.code == Code.OK
    [message] = [a.message for a in answers if a.HasField("message")]
    receipt = message.system_properties.receipt_handle
    assert message.body == b"real" and message.system_properties.delivery_attempt == 1
    topic = rmq.Resource(name=TOPIC)
    forged = svc.AckMessageRequest(group=group, topic=topic, entries=[
        svc.AckMessageEntry(message_id=message.system_properties.message_id,
                            receipt_handle=receipt[:-2] + ("AA" if receipt[-2:] != "AA"
                                                           else "BB")),
        svc.AckMessageEntry(message_id="x", receipt_handle="not a receipt")])
    answer = stub.AckMessage(forged, metadata=metadata)
    assert [e.status.code for e in answer.entries] == [Code.INVALID_RECEIPT_HANDLE] * 2
    other_group = svc.AckMessageRequest(group=rmq.Resource(name="other"), topic=topic, entries=[
        svc.AckMessageEntry(message_id="x", receipt_handle=receipt)])
    assert stub.AckMessage(other_group, metadata=metadata).entries[0].status.code == (
        Code.INVALID_RECEIPT_HANDLE)
    real = svc.AckMessageRequest(group=group, topic=topic, entries=[
        svc.AckMessageEntry(message_id="x", receipt_handle=receipt)])
    assert stub.AckMessage(real, metadata=metadata).status.code == Code.OK  # untouched so far
    assert stub.AckMessage(real, metadata=metadata).status.code == Code.INVALID_RECEIPT_HANDLE
