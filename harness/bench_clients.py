"""What the benchmarks' producer and consumer processes share (`node_bench`, `burst_bench`):
the endpoint a process is given (picklable), a client of it, a consumer that ends when told,
and how many consumers of a topic the leaders count."""

from __future__ import annotations

import threading
import time
from multiprocessing.synchronize import Event

from tickwheel.client import Client, Consumer, Credentials
from tickwheel.harness.local_cluster import LocalCluster

BODY = b"x" * 100
"""The benchmarks' message body: 100 bytes."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


Endpoint = tuple[list[str], Credentials]
"""The nodes' gRPC addresses, and the credentials to call them with (picklable: producer and
consumer processes are given it)."""


def endpoint_of(cluster: LocalCluster) -> Endpoint:
    return [node.grpc_address for node in cluster.nodes], cluster.credentials()


def client_of(endpoint: Endpoint, timeout_s: float) -> Client:
    return Client(endpoint[0], timeout_s=timeout_s, credentials=endpoint[1])


def consumer_until(client: Client, topic: str, name: str, stop: Event) -> Consumer:
    """A consumer of ``topic`` (prefetch 2,000) that closes once ``stop`` is set, ending its
    iteration."""
    consumer = client.consume(topic, prefetch=2_000, name=name)

    def close_when_stopped() -> None:
        stop.wait()
        consumer.close(0.5)
    threading.Thread(target=close_when_stopped, daemon=True).start()
    return consumer


def subscribed(cluster: LocalCluster, topic: str) -> int:
    """The consumers of ``topic`` every shard's leader counts, the fewest (0 while one does
    not answer)."""
    infos = [leader.info() for leader in cluster.leaders()]
    return min(0 if info is None else sum(t.consumers for t in info.topics if t.topic == topic)
               for info in infos)
