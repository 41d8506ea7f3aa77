"""Fixtures the node tests share: a 3-node cluster per test module, and a client of it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tickwheel.client import Client
from tickwheel.harness.local_cluster import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("cluster")) as started:
        started.leader(timeout_s=30)  # three fresh processes, while another worker runs
        yield started


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    with cluster.client(timeout_s=30) as opened:
        yield opened
