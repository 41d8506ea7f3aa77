"""RocketMQ 5's messages and statuses in tickwheel's terms, and back.

- A RocketMQ message becomes a tickwheel message with the same id (the client's message id:
  retries of one send are one message), topic, body and user properties. What tickwheel has no
  field for travels in properties under ``rocketmq.``: the tag, the keys (joined by spaces,
  as RocketMQ 4 stores them), the born time and host, a GZIP body's encoding, and a NORMAL
  type. A native producer may set them too: RocketMQ consumers then see its tag.
- ``DELAY`` is due at ``delivery_timestamp`` (seconds and nanoseconds, as every client sends
  it; a time past is due now); ``NORMAL`` is due now. FIFO, transactional, lite and priority
  messages are refused ``UNSUPPORTED``.
- A delivered message carries its receipt, attempt, digest and times; a delivery tickwheel
  flags as a possible duplicate carries the user property ``tickwheel.possible_duplicate``.
- Refusals are `Refusal` (a RocketMQ `Code` and a message naming the field); tickwheel's own
  errors map by `refusal_of`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from tickwheel.common.errors import (
    ClientError,
    Overloaded,
    PermissionDenied,
    Retryable,
    TickwheelError,
    Unauthenticated,
)
from tickwheel.node.api.forward import LeaderRefused
from tickwheel.rocketmq.v2 import definition_pb2 as rmq
from tickwheel.v1 import tickwheel_pb2 as pb

PREFIX = "rocketmq."
TAG = PREFIX + "tag"
KEYS = PREFIX + "keys"
BORN_MS = PREFIX + "born_ms"
BORN_HOST = PREFIX + "born_host"
ENCODING = PREFIX + "encoding"
TYPE = PREFIX + "type"
POSSIBLE_DUPLICATE = "tickwheel.possible_duplicate"
"""A user property of a delivery an earlier leader may have made already (RocketMQ has no
field for it)."""
MAX_TIMESTAMP_S = 253_402_300_799
"""The last second a protobuf Timestamp may hold (9999-12-31)."""


class Refusal(Exception):
    """A request refused with a RocketMQ status ``code``."""

    def __init__(self, code: rmq.Code, message: str) -> None:
        super().__init__(message)
        self.code = code

    def status(self) -> rmq.Status:
        return rmq.Status(code=self.code, message=str(self))


OK = rmq.Status(code=rmq.Code.OK, message="OK")

_GRPC_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT: rmq.Code.BAD_REQUEST,
    grpc.StatusCode.PERMISSION_DENIED: rmq.Code.FORBIDDEN,
    grpc.StatusCode.UNAUTHENTICATED: rmq.Code.UNAUTHORIZED,
    grpc.StatusCode.RESOURCE_EXHAUSTED: rmq.Code.TOO_MANY_REQUESTS,
    grpc.StatusCode.DEADLINE_EXCEEDED: rmq.Code.PROXY_TIMEOUT,
}


def refusal_of(error: TickwheelError | LeaderRefused) -> Refusal:
    """tickwheel's refusal as RocketMQ's: ``UNAVAILABLE`` (no leader yet, a leader change)
    becomes ``HA_NOT_AVAILABLE``, which the clients retry."""
    if isinstance(error, LeaderRefused):
        code = _GRPC_CODES.get(error.code, rmq.Code.HA_NOT_AVAILABLE
                               if error.code == grpc.StatusCode.UNAVAILABLE
                               else rmq.Code.INTERNAL_SERVER_ERROR)
        return Refusal(code, error.details)
    if isinstance(error, PermissionDenied):
        code = rmq.Code.FORBIDDEN
    elif isinstance(error, Unauthenticated):
        code = rmq.Code.UNAUTHORIZED
    elif isinstance(error, ClientError):
        code = rmq.Code.BAD_REQUEST
    elif isinstance(error, Overloaded):
        code = rmq.Code.TOO_MANY_REQUESTS
    elif isinstance(error, Retryable):
        code = rmq.Code.HA_NOT_AVAILABLE
    else:
        code = rmq.Code.INTERNAL_SERVER_ERROR
    return Refusal(code, str(error))


def duration_ms(duration: Duration) -> int:
    return duration.seconds * 1000 + duration.nanos // 1_000_000


def ms_duration(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=ms % 1000 * 1_000_000)


def ms_timestamp(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=ms % 1000 * 1_000_000)


def check_resource(resource: rmq.Resource, field: str) -> str:
    """A topic's or group's name; namespaces are refused (tickwheel has none)."""
    if resource.resource_namespace:
        raise Refusal(rmq.Code.BAD_REQUEST, f"{field}.resource_namespace: namespaces are not "
                                            "supported; leave it empty")
    return resource.name


def to_tickwheel(message: rmq.Message, field: str, now_ms: int, max_delay_ms: int
                 ) -> pb.Message:
    """The tickwheel message a RocketMQ client sends (``field``: where it is, for errors)."""
    system = message.system_properties
    if not system.message_id:
        raise Refusal(rmq.Code.ILLEGAL_MESSAGE_ID, f"{field}.system_properties.message_id: "
                                                   "is empty")
    kind = system.message_type
    if kind == rmq.MessageType.MESSAGE_TYPE_UNSPECIFIED:
        kind = (rmq.MessageType.DELAY if system.HasField("delivery_timestamp")
                else rmq.MessageType.NORMAL)
    if kind not in (rmq.MessageType.NORMAL, rmq.MessageType.DELAY) or system.HasField(
            "message_group"):
        raise Refusal(rmq.Code.UNSUPPORTED, f"{field}: tickwheel serves NORMAL and DELAY "
                      f"messages, not {rmq.MessageType.Name(kind)} (nor message groups)")
    result = pb.Message(id=system.message_id, topic=check_resource(message.topic,
                                                                   f"{field}.topic"),
                        body=message.body, properties=_properties(message, field))
    if kind == rmq.MessageType.NORMAL:
        result.properties[TYPE] = "NORMAL"
        result.delay_ms = 0
        return result
    deliver_at_ms = _deliver_at_ms(system, f"{field}.system_properties.delivery_timestamp")
    if deliver_at_ms - now_ms > max_delay_ms:
        raise Refusal(rmq.Code.ILLEGAL_DELIVERY_TIME, f"{field}.system_properties."
                      f"delivery_timestamp: {deliver_at_ms - now_ms} ms from now, beyond "
                      f"max_delay_ms {max_delay_ms}")
    if deliver_at_ms <= now_ms:
        result.delay_ms = 0
    else:
        result.deliver_at_ms = deliver_at_ms
    return result


def _properties(message: rmq.Message, field: str) -> dict[str, str]:
    """The user properties, and the system properties tickwheel has no field for."""
    system = message.system_properties
    properties = dict(message.user_properties.items())
    for key in properties:
        if key.startswith(PREFIX) or key == POSSIBLE_DUPLICATE:
            raise Refusal(rmq.Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                          f"{field}.user_properties[{key[:64]!r}]: keys starting "
                          f"{PREFIX!r} are the node's")
    if system.HasField("tag"):
        if not system.tag or "|" in system.tag:
            raise Refusal(rmq.Code.ILLEGAL_MESSAGE_TAG, f"{field}.system_properties.tag: "
                          "must be non-empty and free of '|'")
        properties[TAG] = system.tag
    if system.keys:
        properties[KEYS] = " ".join(system.keys)
    if system.HasField("born_timestamp"):
        born = system.born_timestamp
        properties[BORN_MS] = str(born.seconds * 1000 + born.nanos // 1_000_000)
    if system.born_host:
        properties[BORN_HOST] = system.born_host
    if system.body_encoding == rmq.Encoding.GZIP:
        properties[ENCODING] = "GZIP"
    return properties


def _deliver_at_ms(system: rmq.SystemProperties, field: str) -> int:
    if not system.HasField("delivery_timestamp"):
        raise Refusal(rmq.Code.ILLEGAL_DELIVERY_TIME, f"{field}: a DELAY message needs one")
    when = system.delivery_timestamp
    if not 0 <= when.seconds <= MAX_TIMESTAMP_S or not 0 <= when.nanos < 1_000_000_000:
        raise Refusal(rmq.Code.ILLEGAL_DELIVERY_TIME, f"{field}: {when.seconds} s is not a "
                      "time (seconds since 1970, not milliseconds)")
    return int(when.seconds * 1000 + when.nanos // 1_000_000)


def to_rocketmq(delivered: pb.Delivered, invisible_ms: int, store_host: str) -> rmq.Message:
    """What a RocketMQ consumer receives for one delivery."""
    properties: Mapping[str, str] = delivered.properties
    user = {key: value for key, value in properties.items() if not key.startswith(PREFIX)}
    if delivered.possible_duplicate:
        user[POSSIBLE_DUPLICATE] = "true"
    born_ms = int(properties.get(BORN_MS, "0") or 0) or delivered.deliver_at_ms
    system = rmq.SystemProperties(
        keys=properties[KEYS].split(" ") if properties.get(KEYS) else [],
        message_id=delivered.id,
        body_digest=rmq.Digest(type=rmq.DigestType.MD5,
                               checksum=hashlib.md5(delivered.body).hexdigest().upper()),
        body_encoding=(rmq.Encoding.GZIP if properties.get(ENCODING) == "GZIP"
                       else rmq.Encoding.IDENTITY),
        message_type=(rmq.MessageType.NORMAL if properties.get(TYPE) == "NORMAL"
                      else rmq.MessageType.DELAY),
        born_timestamp=ms_timestamp(born_ms), born_host=properties.get(BORN_HOST, ""),
        store_timestamp=ms_timestamp(delivered.delivered_at_ms), store_host=store_host,
        delivery_timestamp=ms_timestamp(delivered.deliver_at_ms),
        receipt_handle=delivered.receipt, queue_id=0,
        invisible_duration=ms_duration(invisible_ms), delivery_attempt=delivered.attempt)
    if TAG in properties:
        system.tag = properties[TAG]
    return rmq.Message(topic=rmq.Resource(name=delivered.topic), user_properties=user,
                       system_properties=system, body=delivered.body)


class TagFilter:
    """A subscription's ``TAG`` expression: ``*`` (every message), or tags joined by ``||``.
    SQL92 expressions are refused."""

    def __init__(self, expression: rmq.FilterExpression, field: str) -> None:
        if expression.type == rmq.FilterType.SQL:
            raise Refusal(rmq.Code.ILLEGAL_FILTER_EXPRESSION,
                          f"{field}: SQL92 filters are not supported; filter by TAG")
        text = expression.expression.strip()
        tags = {tag.strip() for tag in text.split("||")}
        self.tags: frozenset[str] | None = None if text in ("", "*") else frozenset(tags)
        if self.tags is not None and "" in self.tags:
            raise Refusal(rmq.Code.ILLEGAL_FILTER_EXPRESSION,
                          f"{field}: {text[:128]!r} has an empty tag")

    def matches(self, delivered: pb.Delivered) -> bool:
        return self.tags is None or delivered.properties.get(TAG) in self.tags
