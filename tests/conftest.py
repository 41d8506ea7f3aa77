"""Hypothesis profiles: ``ci`` (default) keeps ``make test`` short; ``deep`` searches longer.

Select with ``HYPOTHESIS_PROFILE=deep``. Every failure prints its seed and steps, so it replays.
Also the fixtures that cluster tests share.
"""

import os
import threading
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, settings
from tickwheel.client import Client, Consumer
from tickwheel.replication.local_cluster import LocalCluster

settings.register_profile("ci", max_examples=150, stateful_step_count=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=3_000, stateful_step_count=80, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def acking_consumer() -> Iterator[Callable[..., Consumer]]:
    """``acking_consumer(cluster, topic)`` starts a client-library consumer (in a thread) that
    acknowledges everything of ``topic``, following the leader across failovers; every one is
    closed at teardown."""
    started: list[tuple[Client, Consumer, threading.Thread]] = []

    def start(cluster: LocalCluster, topic: str = "orders", prefetch: int = 1_000) -> Consumer:
        client = Client([node.grpc_address for node in cluster.nodes], timeout_s=60)
        consumer = client.consume(topic, prefetch=prefetch, name=f"test-{topic}")

        def run() -> None:
            for message in consumer:
                message.ack()
        thread = threading.Thread(target=run, name=f"consumer-{topic}", daemon=True)
        thread.start()
        started.append((client, consumer, thread))
        return consumer

    yield start
    for client, consumer, thread in started:
        consumer.close(timeout_s=0.5)
        thread.join(10)
        client.close()
