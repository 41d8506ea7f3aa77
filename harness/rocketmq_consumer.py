"""The node benchmark's RocketMQ consumers: processes of RocketMQ 5's official Python client.

A process of its own for each: the client's protos clash with the node's copy in one process,
so the client is imported in `consume`, in the child, never at the top of this module.
"""

from __future__ import annotations

import os
import threading
import time
from multiprocessing.queues import Queue
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event

from tickwheel.harness.local_cluster import LocalCluster

GROUP = "bench-rocketmq"

Endpoint = tuple[str, str, str, str]
"""A RocketMQ listener's address, the cluster's CA file, an AccessKey and its SecretKey."""


def endpoint(cluster: LocalCluster) -> Endpoint:
    """The leader's RocketMQ listener, as the cluster's admin."""
    leader = cluster.leader()
    assert cluster.security is not None and leader.rocketmq_address is not None
    return (leader.rocketmq_address, str(cluster.security.ca_file), "admin",
            cluster.rocketmq_secret_key("admin"))


def consume(endpoint: Endpoint, topic: str, received: Synchronized[int],
            warmed: Synchronized[int], stop: Event, results: Queue[list[float]]) -> None:
    """One process of RocketMQ 5's official Python client: a PushConsumer of `GROUP` on
    ``topic`` and its warm-up topic, noting each message's lateness (due time from the body)
    as its listener is called; the client acks on return."""
    os.environ["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = endpoint[1]
    # The official client ships no types: its names are Any to mypy (a seam, as pysyncobj).
    from rocketmq import (  # type: ignore[import-untyped]  # noqa: PLC0415
        ClientConfiguration,
        ConsumeResult,
        Credentials,
        FilterExpression,
        Message,
        MessageListener,
        PushConsumer,
    )
    lateness: list[float] = []
    lock = threading.Lock()

    class Listener(MessageListener):  # type: ignore[misc]  # subclasses the untyped client's
        def consume(self, message: Message) -> ConsumeResult:
            arrived_ms = time.time_ns() / 1e6
            if message.topic != topic:
                with warmed.get_lock():
                    warmed.value += 1
                return ConsumeResult.SUCCESS
            due_ms = int(message.body.split(b":", 1)[0])
            with lock:
                lateness.append(arrived_ms - due_ms)
            with received.get_lock():
                received.value += 1
            return ConsumeResult.SUCCESS

    configuration = ClientConfiguration(endpoint[0], Credentials(endpoint[2], endpoint[3]),
                                        request_timeout=10)
    consumer = PushConsumer(configuration, GROUP, Listener(),
                            {topic: FilterExpression("*"),
                             f"{topic}-warmup": FilterExpression("*")}, tls_enable=True)
    consumer.startup()
    stop.wait()
    consumer.shutdown()
    with lock:
        results.put(lateness)
