"""A consumer that acknowledges everything, for tests and benchmarks that need deliveries to
go somewhere while they watch something else."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Self

from tickwheel.client import Received
from tickwheel.harness.local_cluster import LocalCluster


class AckingConsumer:
    """A client-library consumer of ``topic`` in a thread that acknowledges everything it
    receives, following the leader across failovers; ``on_message`` (called in that thread)
    sees each message first. A context manager; `close` ends the stream and the thread."""

    def __init__(self, cluster: LocalCluster, topic: str = "orders", *, prefetch: int = 1_000,
                 on_message: Callable[[Received], None] | None = None) -> None:
        self._client = cluster.client(timeout_s=60)
        self._consumer = self._client.consume(topic, prefetch=prefetch, name=f"acking-{topic}")
        self._on_message = on_message
        self._thread = threading.Thread(target=self._run, name=f"consumer-{topic}", daemon=True)
        self._thread.start()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._consumer.close(timeout_s=0.5)
        self._thread.join(10)
        self._client.close()

    def _run(self) -> None:
        for message in self._consumer:
            if self._on_message is not None:
                self._on_message(message)
            message.ack()
