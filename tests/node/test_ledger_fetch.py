"""``tickwheel ledger fetch`` against 3 real nodes after traffic: every node's closed segments
land in DIR's layout, each matching its manifest's SHA-256; a second run fetches nothing new;
a damaged local copy is fetched again; a principal without an admin grant on every topic is
refused every ledger call; a node that is down is reported, and the others still fetched;
``--close-open`` fetches the rows of the nodes' open segments too, and without it they stay."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pyarrow.parquet as pq
import pytest
from test_cli import tickwheel

from tickwheel.client import Message, PermissionDenied
from tickwheel.client.ledger import LedgerClient, Node
from tickwheel.harness.local_cluster import LocalCluster, wait_for
from tickwheel.node.ledger import read_manifest, segments

pytestmark = pytest.mark.cluster

IDS = [f"fetched-{i}" for i in range(30)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = Path(tmp_path_factory.mktemp("fetch"))
    with LocalCluster(root, principals={"orders-admin": [
            {"actions": ["admin"], "topics": ["orders"]}]}) as cluster:
        with cluster.client(timeout_s=30) as client:
            client.schedule_many([Message("orders", b"x", delay_ms=0, id=i) for i in IDS])
            with client.consume("orders", prefetch=64) as consumer:
                for count, message in enumerate(consumer, 1):
                    message.ack()
                    if count == len(IDS):
                        break
        for node in cluster.nodes:
            wait_for(lambda node=node: len(node.ledger("acked")) >= len(IDS), 20,
                     f"{node.raft}'s ledger to hold every ack")
        yield cluster


def fetch(cluster: LocalCluster, out: Path, *flags: str, principal: str = "admin"
          ) -> subprocess.CompletedProcess[str]:
    assert cluster.security is not None
    return tickwheel("ledger", "fetch", "--target", cluster.nodes[0].grpc_address,
                     "--out", str(out), *flags,
                     env=cluster.security.environment(principal))


def fetched(out: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((out / "fetch.json").read_text())
    return report


def test_every_nodes_segments_are_fetched_verified_then_only_what_is_new(
        cluster: LocalCluster, tmp_path: Path) -> None:
    before = {node.raft: [path.name for path in segments(node.data / "ledger")]
              for node in cluster.nodes}
    first = fetch(cluster, tmp_path, "--since", "1h")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "ledger segments" in first.stderr  # the progress, on stderr
    report = fetched(tmp_path)
    assert report["missed"] == [] and len(report["nodes"]) == 3
    assert all(node["reached"] for node in report["nodes"])
    for node in cluster.nodes:
        folder = tmp_path / "shard-0" / node.raft.replace(":", "_")
        names = {path.name for path in folder.glob("*.parquet")}
        assert set(before[node.raft]) <= names
        for path in folder.glob("*.parquet"):
            manifest = read_manifest(path)
            assert hashlib.sha256(path.read_bytes()).hexdigest() == manifest.sha256
            assert manifest.node == node.raft
    assert all(segment["fetched"] for segment in report["segments"])
    assert not list(tmp_path.rglob("*.part"))
    stamps = {path: path.stat().st_mtime_ns for path in tmp_path.rglob("*.parquet")}

    second = fetch(cluster, tmp_path, "--quiet")
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.stderr == ""
    again = {segment["file"]: segment["fetched"] for segment in fetched(tmp_path)["segments"]}
    for path, stamp in stamps.items():
        assert again[str(path.relative_to(tmp_path))] is False
        assert path.stat().st_mtime_ns == stamp

    damaged = sorted(stamps)[0]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    third = fetch(cluster, tmp_path, "--quiet")
    assert third.returncode == 0, third.stdout + third.stderr
    again = {segment["file"]: segment["fetched"] for segment in fetched(tmp_path)["segments"]}
    assert again[str(damaged.relative_to(tmp_path))] is True
    assert sum(again.values()) == 1 + (len(again) - len(stamps))
    assert hashlib.sha256(damaged.read_bytes()).hexdigest() == read_manifest(damaged).sha256


def test_only_an_admin_of_every_topic_reads_a_ledger(cluster: LocalCluster,
                                                     tmp_path: Path) -> None:
    refused = fetch(cluster, tmp_path, principal="orders-admin")
    assert refused.returncode == 1 and "PERMISSION_DENIED" in refused.stdout, refused.stdout
    node = Node(0, cluster.nodes[1].grpc_address)
    with LedgerClient(node.grpc_address,
                      credentials=cluster.credentials("orders-admin")) as ledger:
        with pytest.raises(PermissionDenied):
            ledger.segments(node)
        with pytest.raises(PermissionDenied):
            b"".join(ledger.read(node, 1))
        with pytest.raises(PermissionDenied):
            ledger.trace(IDS[0], nodes=[node])
    with LedgerClient(node.grpc_address, credentials=cluster.credentials()) as ledger:
        with pytest.raises(Exception) as missing:
            b"".join(ledger.read(node, 10 ** 9))
        assert getattr(missing.value, "code", None) == grpc.StatusCode.NOT_FOUND


def test_a_node_down_is_reported_and_the_others_fetched(cluster: LocalCluster,
                                                        tmp_path: Path) -> None:
    down = cluster.nodes[2]
    cluster.stop(down)
    result = fetch(cluster, tmp_path, "--quiet")
    assert result.returncode == 1
    assert f"missed shard 0 node {down.grpc_address}" in result.stdout, result.stdout
    report = fetched(tmp_path)
    assert [missed["grpc_address"] for missed in report["missed"]] == [down.grpc_address]
    assert {segment["node"] for segment in report["segments"]} == {
        node.raft for node in cluster.nodes[:2]}


def test_close_open_fetches_the_rows_of_the_last_seconds(tmp_path: Path) -> None:
    """A node whose open segment would stay open ten minutes: its rows of a moment ago are
    fetched with --close-open alone (the chaos runner's fetch at the end of a run needs
    them)."""
    ids = [f"recent-{i}" for i in range(5)]
    with LocalCluster(tmp_path / "cluster", 1, ledger_segment_age_ms=600_000) as cluster:
        with cluster.client(timeout_s=30) as client:
            client.schedule_many([Message("orders", b"x", delay_ms=3_600_000, id=i)
                                  for i in ids])
        without = fetch(cluster, tmp_path / "without", "--quiet")
        assert without.returncode == 0, without.stdout + without.stderr
        assert fetched(tmp_path / "without")["close_open"] is False
        assert scheduled_ids(tmp_path / "without") == set()
        closing = fetch(cluster, tmp_path / "with", "--quiet", "--close-open")
        assert closing.returncode == 0, closing.stdout + closing.stderr
        assert fetched(tmp_path / "with")["close_open"] is True
        assert scheduled_ids(tmp_path / "with") == set(ids)


def scheduled_ids(out: Path) -> set[str]:
    """The ids of the ``scheduled`` rows of every segment fetched into ``out``."""
    return {row["id"] for path in out.rglob("*.parquet")
            for row in pq.read_table(path, columns=["event", "id"]).to_pylist()
            if row["event"] == "scheduled"}
