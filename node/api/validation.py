"""The API's limits, checked at the edge before anything is proposed.

Every request is checked whole before any part of it goes to Raft, so a rejected request leaves
nothing behind. Errors are `InvalidMessage` naming the field as the client wrote it
(``messages[3].topic``); the server maps them to ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple, TypeVar

from google.protobuf.message import DecodeError, Message

from tickwheel.common.errors import InvalidMessage
from tickwheel.node.delivery.levels import DLQ_PREFIX, DelayLevels, is_dead_letter_topic
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.wheel import DAY_MS, NewMessage

_NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})
TOPIC_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,249}")
"""Kafka's topic alphabet and length: safe in file names, metric labels and URLs."""
CONSUMER_PATTERN = re.compile(r"[A-Za-z0-9._:@/\[\]-]{1,128}")
"""What a consumer may call itself: an id, a host and port, a pod name (it reaches logs and the
delivery trail, so no spaces, no control characters)."""
GROUP_PATTERN = re.compile(r"[A-Za-z0-9._-]{0,128}")
MAX_RECEIVE_WAIT_MS = 30_000
"""A consumer group's name: empty for the default group; it names a dead-letter topic."""
RESERVED_PROPERTY_PREFIX = "%"
"""Property keys the node uses itself (a retry copy's group); users' keys cannot start so."""
_WHEN_FIELDS = ("deliver_at_ms", "delay_ms", "delay_level")
_RequestT = TypeVar("_RequestT", bound=Message)


@dataclass(frozen=True, slots=True)
class Limits:
    """What one request may carry. Every limit is named here and configurable."""

    max_body_bytes: int = 4 << 20
    max_delay_ms: int = 366 * DAY_MS
    max_id_bytes: int = 256
    max_properties: int = 64
    max_properties_bytes: int = 64 << 10
    """Keys and values of one message together, UTF-8."""
    max_batch_msgs: int = 10_000
    """Messages in one `Schedule` request."""
    max_stream_msgs: int = 100_000
    """Messages in one `ScheduleStream` call (its answer holds a result for each)."""
    max_credits: int = 10_000
    """Credits one consumer may hold."""
    max_request_bytes: int = 8 << 20
    """The largest request message the node reads (gRPC refuses a larger one as
    ``RESOURCE_EXHAUSTED`` from its length alone, before buffering it); a node reserves its
    request memory in these units (`tickwheel.node.api.admission`). It must fit one message of
    ``max_body_bytes`` and ``max_properties_bytes``; a larger batch must be split (the client
    library says so)."""
    min_visibility_timeout_ms: int = 100
    max_visibility_timeout_ms: int = 12 * 3_600_000


class Checked(NamedTuple):
    """A checked `Schedule` request: wheel messages, and per message the level used when its
    ``delay_level`` was clamped to the table's last (else 0)."""

    messages: list[NewMessage]
    clamped_levels: list[int]


def check_topic(topic: str, field: str, *, dead_letter: bool = False) -> None:
    """A topic producers schedule to; with ``dead_letter``, also ``%DLQ%<topic>`` (consumers
    may read a dead-letter topic; only the node files messages there)."""
    name = topic[len(DLQ_PREFIX):] if dead_letter and is_dead_letter_topic(topic) else topic
    if not TOPIC_PATTERN.fullmatch(name):
        problem = "is empty" if not topic else f"{topic[:80]!r} is not 1-249 of [A-Za-z0-9._-]"
        if is_dead_letter_topic(topic) and not dead_letter:
            problem += f" ({DLQ_PREFIX} topics are filled by the node from nacked messages)"
        raise InvalidMessage(field, problem)


def new_messages(messages: Sequence[pb.Message], now_ms: int, limits: Limits,
                 levels: DelayLevels) -> Checked:
    """Check a `Schedule` request and turn it into wheel messages; ``now_ms`` (the leader's
    clock) resolves ``delay_ms`` and ``delay_level``. An empty id gets a random one."""
    if not messages:
        raise InvalidMessage("messages", "is empty")
    if len(messages) > limits.max_batch_msgs:
        raise InvalidMessage("messages", f"has {len(messages)} messages, at most "
                             f"{limits.max_batch_msgs} per request")
    checked = Checked([], [])
    add_message, add_level = checked.messages.append, checked.clamped_levels.append
    tuple_new = tuple.__new__  # a namedtuple's own constructor is a Python call per message
    checked_topics: set[str] = set()
    max_id_chars = limits.max_id_bytes // 4  # UTF-8: at most 4 bytes a character
    max_body_bytes, latest_ms = limits.max_body_bytes, now_ms + limits.max_delay_ms
    for i, message in enumerate(messages):
        # The usual message, checked inline (a call per message was a tenth of the leader's
        # time): an id short enough in any encoding, a topic already checked, no properties,
        # only deliver_at_ms and within the limits. Anything else takes the full check.
        message_id, topic, body = message.id, message.topic, message.body
        if (message_id and len(message_id) <= max_id_chars and topic in checked_topics
                and len(body) <= max_body_bytes and not message.properties
                and message.HasField("deliver_at_ms") and not message.HasField("delay_ms")
                and not message.HasField("delay_level")
                and 0 <= (deliver_at_ms := message.deliver_at_ms) <= latest_ms):
            # every field given: tuple.__new__ knows no defaults
            add_message(tuple_new(NewMessage, (message_id, topic, body, deliver_at_ms,
                                               _NO_PROPERTIES, 1)))
            add_level(0)
            continue
        new, clamped_level = _new_message(message, i, now_ms, limits, levels, checked_topics)
        add_message(new)
        add_level(clamped_level)
    return checked


def _new_message(message: pb.Message, index: int, now_ms: int, limits: Limits,
                 levels: DelayLevels, checked_topics: set[str]) -> tuple[NewMessage, int]:
    """One message of a request; ``checked_topics`` are topics of earlier messages of the
    request that passed. The field name is made only for an error: this runs per message."""
    message_id = message.id or uuid.uuid4().hex
    if len(message_id) * 4 > limits.max_id_bytes and (
            len(message_id.encode()) > limits.max_id_bytes):  # UTF-8: at most 4 bytes a char
        raise InvalidMessage(f"messages[{index}].id", f"is {len(message_id.encode())} bytes, "
                             f"at most {limits.max_id_bytes}")
    topic = message.topic
    if topic not in checked_topics:
        check_topic(topic, f"messages[{index}].topic")
        checked_topics.add(topic)
    body = message.body
    if len(body) > limits.max_body_bytes:
        raise InvalidMessage(f"messages[{index}].body", f"is {len(body)} bytes, at most "
                             f"{limits.max_body_bytes}")
    given = message.properties
    properties: Mapping[str, str] = _NO_PROPERTIES
    if given:
        _check_properties(given, f"messages[{index}].properties", limits)
        properties = dict(given)
    deliver_at_ms, clamped_level = _deliver_at_ms(message, index, now_ms, limits, levels)
    return NewMessage(message_id, topic, body, deliver_at_ms, properties), clamped_level


def _deliver_at_ms(message: pb.Message, index: int, now_ms: int, limits: Limits,
                   levels: DelayLevels) -> tuple[int, int]:
    """The due time, and the level used if ``delay_level`` was clamped (else 0)."""
    if (message.HasField("deliver_at_ms") and not message.HasField("delay_ms")
            and not message.HasField("delay_level")
            and 0 <= message.deliver_at_ms <= now_ms + limits.max_delay_ms):
        return message.deliver_at_ms, 0  # the usual case, checked in one step
    field = f"messages[{index}]"
    given = [name for name in _WHEN_FIELDS if message.HasField(name)]
    if len(given) != 1:
        raise InvalidMessage(f"{field}.deliver_at_ms", "give exactly one of deliver_at_ms, "
                             f"delay_ms and delay_level ({' and '.join(given) or 'none'} given)")
    if given[0] == "delay_level":
        if message.delay_level < 1:
            raise InvalidMessage(f"{field}.delay_level", f"is {message.delay_level}, levels "
                                 f"start at 1 (the table has {levels.max_level})")
        delay_ms, used = levels.delay_ms(message.delay_level)
        return now_ms + delay_ms, used if used != message.delay_level else 0
    return _deliver_at_ms_given(message, field, now_ms, limits), 0


def _deliver_at_ms_given(message: pb.Message | pb.Move, field: str, now_ms: int,
                         limits: Limits) -> int:
    if message.HasField("delay_ms"):
        if not 0 <= message.delay_ms <= limits.max_delay_ms:
            raise InvalidMessage(f"{field}.delay_ms", f"is {message.delay_ms}, must be 0 to "
                                 f"{limits.max_delay_ms} (max_delay_ms)")
        return now_ms + message.delay_ms
    if message.deliver_at_ms < 0:
        raise InvalidMessage(f"{field}.deliver_at_ms", f"is {message.deliver_at_ms}, must be "
                             ">= 0 (Unix time in ms)")
    if message.deliver_at_ms > now_ms + limits.max_delay_ms:
        raise InvalidMessage(f"{field}.deliver_at_ms", f"is {message.deliver_at_ms - now_ms} ms "
                             f"ahead, beyond max_delay_ms {limits.max_delay_ms}")
    return message.deliver_at_ms


def move_times(moves: Sequence[pb.Move], now_ms: int, limits: Limits) -> list[int]:
    """The new due time of each move (``delay_ms`` from ``now_ms``, the leader's clock)."""
    if not moves:
        raise InvalidMessage("moves", "is empty")
    if len(moves) > limits.max_batch_msgs:
        raise InvalidMessage("moves", f"has {len(moves)}, at most {limits.max_batch_msgs}")
    times = []
    for index, move in enumerate(moves):
        field = f"moves[{index}]"
        if move.HasField("deliver_at_ms") == move.HasField("delay_ms"):
            raise InvalidMessage(f"{field}.deliver_at_ms",
                                 "give exactly one of deliver_at_ms and delay_ms")
        times.append(_deliver_at_ms_given(move, field, now_ms, limits))
    return times


def _check_properties(properties: Mapping[str, str], field: str, limits: Limits) -> None:
    if len(properties) > limits.max_properties:
        raise InvalidMessage(field, f"has {len(properties)} entries, at most "
                             f"{limits.max_properties}")
    size = sum(len(key.encode()) + len(value.encode()) for key, value in properties.items())
    if size > limits.max_properties_bytes:
        raise InvalidMessage(field, f"are {size} bytes, at most {limits.max_properties_bytes}")
    if "" in properties:
        raise InvalidMessage(field, "has an empty key")
    for key in properties:
        if key.startswith(RESERVED_PROPERTY_PREFIX):
            raise InvalidMessage(field, f"key {key[:80]!r} starts with "
                                 f"{RESERVED_PROPERTY_PREFIX!r}, which is reserved")


def check_subscribe(subscribe: pb.Subscribe, limits: Limits, default_visibility_ms: int
                    ) -> int:
    """Check a `Receive` subscription; returns its visibility timeout in ms."""
    check_topic(subscribe.topic, "subscribe.topic", dead_letter=True)
    if subscribe.consumer and not CONSUMER_PATTERN.fullmatch(subscribe.consumer):
        raise InvalidMessage("subscribe.consumer", f"{subscribe.consumer[:80]!r} is not 1-128 of "
                             "[A-Za-z0-9._:@/[]-]")
    check_group(subscribe.group, "subscribe.group")
    check_credits(subscribe.credits, 0, limits, "subscribe.credits")
    timeout_ms = subscribe.visibility_timeout_ms or default_visibility_ms
    if not (limits.min_visibility_timeout_ms <= timeout_ms
            <= limits.max_visibility_timeout_ms):
        raise InvalidMessage("subscribe.visibility_timeout_ms", (
            f"is {timeout_ms}, must be {limits.min_visibility_timeout_ms} to "
            f"{limits.max_visibility_timeout_ms}"))
    return timeout_ms


def check_receive(request: pb.ReceiveMessagesRequest, limits: Limits,
                  default_visibility_ms: int) -> tuple[int, int]:
    """Check a `ReceiveMessages` call; returns its invisible duration and wait in ms."""
    check_topic(request.topic, "topic", dead_letter=True)
    check_group(request.group, "group")
    if not CONSUMER_PATTERN.fullmatch(request.consumer):
        raise InvalidMessage("consumer", f"{request.consumer[:80]!r} is not 1-128 of "
                             "[A-Za-z0-9._:@/[]-] (calls naming one consumer share it)")
    if not 1 <= request.max_messages <= limits.max_credits:
        raise InvalidMessage("max_messages", f"is {request.max_messages}, must be 1 to "
                             f"{limits.max_credits}")
    invisible_ms = request.invisible_duration_ms or default_visibility_ms
    _check_invisible(invisible_ms, limits, limits.min_visibility_timeout_ms)
    if not 0 <= request.wait_ms <= MAX_RECEIVE_WAIT_MS:
        raise InvalidMessage("wait_ms", f"is {request.wait_ms}, must be 0 to "
                             f"{MAX_RECEIVE_WAIT_MS}")
    return invisible_ms, request.wait_ms


def check_settle(request: pb.SettleRequest, limits: Limits, *, change: bool) -> None:
    """Check an `AckMessages` or `ChangeInvisibleDuration` call."""
    check_topic(request.topic, "topic", dead_letter=True)
    check_group(request.group, "group")
    if not request.receipts:
        raise InvalidMessage("receipts", "is empty")
    if len(request.receipts) > limits.max_batch_msgs:
        raise InvalidMessage("receipts", f"has {len(request.receipts)}, at most "
                             f"{limits.max_batch_msgs}")
    if change:
        _check_invisible(request.invisible_duration_ms, limits, 0)


def _check_invisible(invisible_ms: int, limits: Limits, least_ms: int) -> None:
    if not least_ms <= invisible_ms <= limits.max_visibility_timeout_ms:
        raise InvalidMessage("invisible_duration_ms", (
            f"is {invisible_ms}, must be {least_ms} to {limits.max_visibility_timeout_ms}"))


def check_group(group: str, field: str) -> None:
    if not GROUP_PATTERN.fullmatch(group):
        raise InvalidMessage(field, f"{group[:80]!r} is not 0-128 of [A-Za-z0-9._-]")


def check_credits(credits: int, held: int, limits: Limits, field: str = "credit.credits"
                  ) -> None:
    if held + credits > limits.max_credits:
        raise InvalidMessage(field, f"would give the consumer {held + credits} credits, at "
                             f"most {limits.max_credits}")


def decoder(message_class: type[_RequestT]) -> Callable[[bytes], _RequestT]:
    """``message_class.FromString``, refusing bytes that do not parse (a string that is not
    UTF-8, a truncated field) as `InvalidMessage` naming ``request``."""
    def decode(data: bytes) -> _RequestT:
        try:
            return message_class.FromString(data)
        except DecodeError as error:
            raise InvalidMessage("request", f"could not be decoded: {error}") from None
    return decode
