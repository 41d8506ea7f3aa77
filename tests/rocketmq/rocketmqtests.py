"""What the RocketMQ tests share: signed calls and delay messages spoken by hand."""

from __future__ import annotations

import time
import uuid

from google.protobuf.timestamp_pb2 import Timestamp

from tickwheel.harness.local_cluster import LocalCluster
from tickwheel.node.rocketmq.signature import signature
from tickwheel.rocketmq.v2 import definition_pb2 as rmq

TOPIC = "parcels"


def signed(cluster: LocalCluster, access_key: str = "admin", key: str | None = None
           ) -> tuple[tuple[str, str], ...]:
    if key is None:
        key = cluster.rocketmq_secret_key(access_key)
    date = time.strftime("%Y%m%dT%H%M%SZ")
    return (("x-mq-date-time", date), ("x-mq-client-id", "test@1"),
            ("authorization", f"MQv2-HMAC-SHA1 Credential={access_key}, "
                              f"SignedHeaders=x-mq-date-time, Signature={signature(key, date)}"))


def delay_message(seconds: int, body: bytes = b"x") -> rmq.Message:
    return rmq.Message(topic=rmq.Resource(name=TOPIC), body=body, system_properties=
                       rmq.SystemProperties(message_id=uuid.uuid4().hex,
                                            message_type=rmq.MessageType.DELAY,
                                            delivery_timestamp=Timestamp(seconds=seconds)))
