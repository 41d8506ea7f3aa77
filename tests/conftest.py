"""Hypothesis profiles: ``ci`` (default) keeps ``make test`` short; ``deep`` searches longer.

Select with ``HYPOTHESIS_PROFILE=deep``. Every failure prints its seed and steps, so it replays.
Also the fixtures that cluster tests share.
"""

import os
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, settings

from tickwheel.replication.local_cluster import AckingConsumer, LocalCluster

settings.register_profile("ci", max_examples=150, stateful_step_count=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=3_000, stateful_step_count=80, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def acking_consumer() -> Iterator[Callable[..., AckingConsumer]]:
    """``acking_consumer(cluster, topic)`` starts an `AckingConsumer` of ``topic``; every one
    is closed at teardown."""
    started: list[AckingConsumer] = []

    def start(cluster: LocalCluster, topic: str = "orders", prefetch: int = 1_000
              ) -> AckingConsumer:
        started.append(AckingConsumer(cluster, topic, prefetch=prefetch))
        return started[-1]

    yield start
    for consumer in started:
        consumer.close()
