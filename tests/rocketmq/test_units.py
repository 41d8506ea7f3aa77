"""The RocketMQ listener's parts without a cluster: signatures, message conversion, filters."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from tickwheel.common.errors import Unauthenticated
from tickwheel.node.rocketmq import convert
from tickwheel.node.rocketmq.convert import Refusal
from tickwheel.node.rocketmq.signature import Signatures, secret_key, signature
from tickwheel.node.security import dev_credentials
from tickwheel.node.security.access import AccessFile
from tickwheel.node.settings.config import NodeSettings
from tickwheel.rocketmq.v2 import definition_pb2 as rmq
from tickwheel.v1 import tickwheel_pb2 as pb

OLD, NEW = b"old-secret-0123456789", b"new-secret-0123456789"
NOW_MS = 1_800_000_000_000


def headers(access_key: str, key: str, date: str = "20261125T101010Z") -> dict[str, str]:
    return {"x-mq-date-time": date, "authorization": f"MQv2-HMAC-SHA1 Credential={access_key},"
            f" SignedHeaders=x-mq-date-time, Signature={signature(key, date)}"}


@pytest.fixture
def access(tmp_path: Path) -> AccessFile:
    made = dev_credentials.make(tmp_path, principals={"orders": [
        {"actions": ["schedule"], "topics": ["orders"]}]}, rocketmq=True)
    return AccessFile(made.access_file)


def test_a_signature_names_its_principal_under_either_secret_of_a_rotation(
        access: AccessFile) -> None:
    signatures = Signatures(access, [NEW, OLD])
    for secret in (OLD, NEW):
        assert signatures.principal(headers("orders", secret_key(secret, "orders"))).name == (
            "orders")
    with pytest.raises(Unauthenticated, match="does not match"):
        signatures.principal(headers("orders", secret_key(b"another-secret-0123", "orders")))
    with pytest.raises(Unauthenticated, match="does not match"):  # another key's secret
        signatures.principal(headers("orders", secret_key(NEW, "admin")))
    with pytest.raises(Unauthenticated, match="no credentials"):
        signatures.principal({})
    with pytest.raises(Unauthenticated, match="Credential and Signature"):
        signatures.principal({"authorization": "MQv2-HMAC-SHA1 Credential=orders"})
    assert secret_key(NEW, "orders") != secret_key(OLD, "orders")
    assert Signatures(None, []).principal({}).name == "anyone"  # auth off: insecure_grpc


def test_the_listener_needs_a_raft_secret_to_derive_keys(tmp_path: Path) -> None:
    made = dev_credentials.make(tmp_path)
    flags = {"tls_cert_file": made.cert_file, "tls_key_file": made.key_file,
             "access_file": made.access_file, "rocketmq_listen": "127.0.0.1:8081"}
    with pytest.raises(ValueError, match="derived from the Raft secret"):
        NodeSettings(**flags)
    (tmp_path / "secret").write_text("a-long-enough-raft-secret")
    assert NodeSettings(**flags, raft_secret_file=tmp_path / "secret").rocketmq_listen


def message(**system: object) -> rmq.Message:
    return rmq.Message(topic=rmq.Resource(name="orders"), body=b"b",
                       user_properties={"k": "v"},
                       system_properties=rmq.SystemProperties(message_id="01AB", **system))


def test_delivery_timestamps_are_seconds_and_a_past_one_is_due_now() -> None:
    due = convert.to_tickwheel(message(message_type=rmq.MessageType.DELAY, delivery_timestamp=
                                       Timestamp(seconds=NOW_MS // 1000 + 10, nanos=5_000_000)),
                               "messages[0]", NOW_MS, 86_400_000)
    assert due.deliver_at_ms == NOW_MS + 10_005 and due.id == "01AB"
    assert dict(due.properties) == {"k": "v"}
    past = convert.to_tickwheel(message(delivery_timestamp=Timestamp(seconds=1)), "m", NOW_MS,
                                86_400_000)
    assert past.HasField("delay_ms") and past.delay_ms == 0
    with pytest.raises(Refusal, match="not milliseconds") as refused:
        convert.to_tickwheel(message(delivery_timestamp=Timestamp(seconds=NOW_MS)), "m",
                             NOW_MS, 86_400_000)
    assert refused.value.code == rmq.Code.ILLEGAL_DELIVERY_TIME
    with pytest.raises(Refusal, match="beyond max_delay_ms"):
        later = Timestamp(seconds=NOW_MS // 1000 + 90_000)
        convert.to_tickwheel(message(delivery_timestamp=later), "m", NOW_MS, 86_400_000)
    normal = convert.to_tickwheel(message(message_type=rmq.MessageType.NORMAL, tag="t",
                                          keys=["a", "b"]), "m", NOW_MS, 86_400_000)
    assert normal.delay_ms == 0 and normal.properties[convert.TAG] == "t"
    assert normal.properties[convert.KEYS] == "a b"


def test_reserved_property_keys_and_bad_tags_are_refused() -> None:
    bad = message(message_type=rmq.MessageType.NORMAL)
    bad.user_properties[convert.TAG] = "forged"
    with pytest.raises(Refusal) as refused:
        convert.to_tickwheel(bad, "m", NOW_MS, 86_400_000)
    assert refused.value.code == rmq.Code.ILLEGAL_MESSAGE_PROPERTY_KEY
    with pytest.raises(Refusal) as refused:
        convert.to_tickwheel(message(tag="a||b"), "m", NOW_MS, 86_400_000)
    assert refused.value.code == rmq.Code.ILLEGAL_MESSAGE_TAG


def test_a_delivery_carries_its_tag_keys_digest_and_flag() -> None:
    delivered = pb.Delivered(id="01AB", topic="orders", body=b"hello", deliver_at_ms=NOW_MS,
                             delivered_at_ms=NOW_MS + 3, attempt=2, possible_duplicate=True,
                             receipt="r", properties={convert.TAG: "t", convert.KEYS: "a b",
                                                      "k": "v"})
    out = convert.to_rocketmq(delivered, 30_000, "node")
    system = out.system_properties
    assert (system.tag, list(system.keys), system.delivery_attempt) == ("t", ["a", "b"], 2)
    assert system.body_digest.checksum == "5D41402ABC4B2A76B9719D911017C592"  # MD5, upper
    assert dict(out.user_properties) == {"k": "v", convert.POSSIBLE_DUPLICATE: "true"}
    assert system.receipt_handle == "r" and system.invisible_duration.seconds == 30


def test_tag_filters() -> None:
    tagged = pb.Delivered(properties={convert.TAG: "b"})
    assert convert.TagFilter(rmq.FilterExpression(type=rmq.FilterType.TAG,
                                                  expression="a || b"), "f").matches(tagged)
    assert not convert.TagFilter(rmq.FilterExpression(expression="a"), "f").matches(tagged)
    assert convert.TagFilter(rmq.FilterExpression(expression="*"), "f").matches(pb.Delivered())
    assert not convert.TagFilter(rmq.FilterExpression(expression="a"), "f").matches(
        pb.Delivered())
    with pytest.raises(Refusal):
        convert.TagFilter(rmq.FilterExpression(type=rmq.FilterType.SQL, expression="a>1"), "f")
