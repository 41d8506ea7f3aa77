"""Drives RocketMQ 5's official Python client (``rocketmq-python-client``) against a node's
RocketMQ listener, in a process of its own: the client registers its protos in the default
descriptor pool, where tickwheel's copy would clash.

``python official_client.py ROLE CONFIG_JSON``; every event is one JSON line on stdout. The
config names the endpoint, the AccessKey and SecretKey, and the role's options; the cluster's
CA comes in ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`` (the client trusts the system's roots, which
gRPC reads from there). Roles:

- ``produce``: send ``count`` DELAY messages due ``delay_s`` whole seconds on (the official
  example's ``int(time.time()) + N``), ``tags`` in turn; recall the ones at ``recall``.
- ``simple``: a SimpleConsumer of ``group`` with filter ``tag``: receive until ``expect``
  distinct ids (or ``timeout_s``); the first message received is not acked but put back for
  ``retry_s`` (ChangeInvisibleDuration), and acked when it comes again; then receive for
  ``quiet_s`` more, reporting anything that still comes.
- ``push``: a PushConsumer of ``group``; its listener fails the first attempt of the ids
  whose body is in ``fail_bodies``; runs until ``expect`` successes (or ``timeout_s``).
"""

from __future__ import annotations

import json
import sys
import threading
import time

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
)

_STDOUT = threading.Lock()


def emit(event: str, **fields: object) -> None:
    """One whole line per event: the push consumer's listener runs on a pool of threads, and
    ``print`` writes the text and its newline apart, so two events could share a line."""
    line = json.dumps({"event": event, "at": time.time(), **fields}) + "\n"
    with _STDOUT:
        sys.stdout.write(line)
        sys.stdout.flush()


def main() -> None:
    role, config = sys.argv[1], json.loads(sys.argv[2])
    credentials = Credentials(config["access_key"], config["secret_key"])
    client_config = ClientConfiguration(config["endpoint"], credentials, request_timeout=5)
    {"produce": produce, "simple": simple, "push": push}[role](client_config, config)


def produce(client_config: object, config: dict) -> None:
    producer = Producer(client_config, (config["topic"],), tls_enable=True)
    producer.startup()
    emit("started")
    tags = config.get("tags", ["created"])
    for index in range(config["count"]):
        message = Message()
        message.topic = config["topic"]
        message.body = f"{config.get('prefix', 'm')}-{index}".encode()
        message.tag = tags[index % len(tags)]
        message.keys = f"order-{index}"
        message.delivery_timestamp = int(time.time()) + config["delay_s"]
        try:
            receipt = producer.send(message)
        except Exception as error:
            emit("send_failed", body=message.body.decode(), error=repr(error)[:300])
            continue
        emit("sent", id=receipt.message_id, body=message.body.decode(), tag=message.tag,
             due_s=message.delivery_timestamp, recall_handle=receipt.recall_handle)
        if index in config.get("recall", ()):
            emit("recalled", id=producer.recall_message(config["topic"],
                                                        receipt.recall_handle))
        if config.get("pause_s"):
            time.sleep(config["pause_s"])
    producer.shutdown()
    emit("done")


def _received(message: object, **extra: object) -> dict:
    properties = dict(message.properties or {})
    return {"id": message.message_id, "body": message.body.decode(), "tag": message.tag,
            "keys": sorted(message.keys or ()), "attempt": message.delivery_attempt,
            "flagged": properties.get("tickwheel.possible_duplicate") == "true", **extra}


def simple(client_config: object, config: dict) -> None:
    consumer = SimpleConsumer(client_config, config["group"],
                              {config["topic"]: FilterExpression(config.get("tag", "*"))},
                              await_duration=config.get("poll_s", 5), tls_enable=True)
    consumer.startup()
    emit("started")
    seen: set[str] = set()
    put_back: str | None = None
    deadline = time.time() + config["timeout_s"]
    while (len(seen) < config["expect"] or put_back is not None) and time.time() < deadline:
        for message in _receive(consumer, config.get("invisible_s", 15)):
            emit("received", **_received(message))
            try:
                if (config.get("retry_s") and put_back is None
                        and message.message_id not in seen):
                    consumer.change_invisible_duration(message, config["retry_s"])
                    put_back = message.message_id
                    emit("put_back", id=message.message_id)
                else:
                    if message.message_id == put_back:
                        put_back = None
                    consumer.ack(message)
                    emit("acked", id=message.message_id)
            except Exception as error:  # a leader change: the lease runs out, it comes again
                emit("settle_failed", id=message.message_id, error=repr(error)[:300])
            seen.add(message.message_id)
    quiet_until = time.time() + config.get("quiet_s", 0)
    while time.time() < quiet_until:
        for message in _receive(consumer, 15):
            emit("received", **_received(message, late=True))
            consumer.ack(message)
    consumer.shutdown()
    emit("done", distinct=len(seen))


def _receive(consumer: object, invisible_s: int) -> list:
    try:
        return consumer.receive(16, invisible_s)
    except Exception as error:  # a leader change: the client asks again
        emit("receive_failed", error=repr(error)[:300])
        time.sleep(0.5)
        return []


def push(client_config: object, config: dict) -> None:
    done = threading.Event()
    succeeded: set[str] = set()
    fail_bodies = set(config.get("fail_bodies", ()))
    lock = threading.Lock()

    class Listener(MessageListener):
        def consume(self, message: object) -> object:
            body = message.body.decode()
            if body in fail_bodies and message.delivery_attempt == 1:
                emit("failed", **_received(message))
                return ConsumeResult.FAILURE
            with lock:
                emit("consumed", **_received(message))
                succeeded.add(message.message_id)
                if len(succeeded) >= config["expect"]:
                    done.set()
            return ConsumeResult.SUCCESS

    consumer = PushConsumer(client_config, config["group"], Listener(),
                            {config["topic"]: FilterExpression("*")}, tls_enable=True)
    consumer.startup()
    emit("started")
    done.wait(config["timeout_s"])
    time.sleep(config.get("quiet_s", 0))
    consumer.shutdown()
    emit("done", distinct=len(succeeded))


if __name__ == "__main__":
    main()
