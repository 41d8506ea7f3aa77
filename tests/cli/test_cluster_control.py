"""What ``tickwheel cluster up`` records in its data folder and how ``cluster grow`` asks it,
without a node: the layout a folder keeps, the growths refused before any node starts, and
the control socket's conversation (threads and a Unix socket, no process); and the table
of docs/shards.md that says which node of ``cluster up --shards`` serves which shard."""

from __future__ import annotations

import os
import re
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from tickwheel.cli.cluster_control import ControlServer, Reply, answering, ask
from tickwheel.cli.cluster_state import (
    GROWTH_WINDOW_MS,
    ClusterState,
    growth_refusal,
    layout_refusal,
    read_state,
)
from tickwheel.harness.local_cluster import LocalCluster

SHARDS_DOC = Path(__file__).resolve().parents[2] / "docs" / "shards.md"
STATE = ClusterState(pid=1, control="/nowhere", nodes=3, shards=2, base_port=7400)


def test_the_state_is_read_as_written(tmp_path: Path) -> None:
    assert read_state(tmp_path) is None
    grown = ClusterState(5, "/c.sock", 3, 4, 7400, map_version=2, grown_from=2,
                         grown_at_ms=1_700_000_000_000)
    grown.write(tmp_path)
    assert read_state(tmp_path) == grown
    assert [p.name for p in tmp_path.iterdir()] == ["cluster.json"]  # no half-written file


def test_a_folder_keeps_its_layout() -> None:
    assert layout_refusal(None, 2, 3, 7400) is None
    assert layout_refusal(STATE, 2, 3, 7400) is None
    grown = ClusterState(1, "/c", 3, 4, 7400, map_version=2, grown_from=2)
    refusal = layout_refusal(grown, 2, 3, 7400)
    assert refusal is not None and "--shards 4 --nodes 3 --base-port 7400" in refusal
    assert "grown from 2" in refusal
    assert layout_refusal(STATE, 2, 1, 7400) is not None
    assert layout_refusal(STATE, 2, 3, 7500) is not None
    assert "room for 100" in (layout_refusal(None, 34, 3, 7400) or "")  # 102 nodes
    assert layout_refusal(None, 0, 3, 7400) is not None


@pytest.mark.parametrize(("shards", "now_ms", "said"), [
    (2, 0, "has 2 shards already"),
    (1, 0, "has 2 shards already"),
    (257, 0, "more than a cluster may have (256)"),
    (34, 0, "room for 100"),
    (4, 1_000 + GROWTH_WINDOW_MS - 1, "grow again in 1 s"),
])
def test_a_growth_that_cannot_start_is_refused_before_any_node_starts(
        shards: int, now_ms: int, said: str) -> None:
    state = STATE if now_ms == 0 else ClusterState(1, "/c", 3, 2, 7400, grown_at_ms=1_000)
    refusal = growth_refusal(state, shards, now_ms)
    assert refusal is not None and said in refusal, refusal


def test_a_growth_may_start() -> None:
    assert growth_refusal(STATE, 4, 0) is None
    later = ClusterState(1, "/c", 3, 2, 7400, grown_at_ms=1_000)
    assert growth_refusal(later, 4, 1_000 + GROWTH_WINDOW_MS) is None


def _serving(server: ControlServer, handle: Any) -> threading.Thread:
    thread = threading.Thread(target=server.serve, args=(10.0, handle), daemon=True)
    thread.start()
    return thread


def test_cluster_grow_gets_the_progress_and_the_answer(tmp_path: Path) -> None:
    server = ControlServer(tmp_path / "control.sock")
    try:
        assert stat.S_IMODE(os.stat(server.path).st_mode) == 0o600
        asked: list[dict[str, Any]] = []

        def handle(request: dict[str, Any], reply: Reply) -> None:
            asked.append(request)
            reply({"progress": "starting"})
            reply({"ok": True, "shards": request["grow_to"]})
        thread = _serving(server, handle)
        assert list(ask(server.path, {"grow_to": 4})) == [{"progress": "starting"},
                                                          {"ok": True, "shards": 4}]
        thread.join(10)
        assert asked == [{"grow_to": 4}]
    finally:
        server.close()
    assert not server.path.exists()
    assert not answering(server.path)
    with pytest.raises(FileNotFoundError):
        list(ask(server.path, {"grow_to": 4}))


def test_a_cluster_up_that_hangs_up_unanswered_is_an_error(tmp_path: Path) -> None:
    server = ControlServer(tmp_path / "control.sock")
    try:
        thread = _serving(server, lambda request, reply: reply({"progress": "starting"}))
        with pytest.raises(ConnectionError, match="hung up"):
            list(ask(server.path, {"grow_to": 4}))
        thread.join(10)
    finally:
        server.close()


def test_a_data_path_too_long_for_a_socket_gets_a_private_folder(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    server = ControlServer(deep / "control.sock")
    try:
        assert server.path.parent != deep and len(os.fsencode(server.path)) <= 107
        assert stat.S_IMODE(os.stat(server.path.parent).st_mode) == 0o700
        thread = _serving(server, lambda request, reply: reply({"ok": True}))
        assert answering(server.path)
        thread.join(10)
    finally:
        server.close()
    assert not server.path.parent.exists()


def test_the_documented_layout_of_cluster_up_is_the_harness(tmp_path: Path) -> None:
    """docs/shards.md's table of which node of ``cluster up --shards 2 --nodes 3`` (grown to
    4) is which: the harness makes the nodes of a growth as it makes those it starts with."""
    row = r"^\| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| `([\w-]+)` \|$"
    rows = re.findall(row, SHARDS_DOC.read_text(), re.M)
    assert len(rows) >= 8
    nodes = LocalCluster(tmp_path, 3, base_port=7400, shards=4, insecure_grpc=True).nodes
    for j, shard, member, grpc, raft, peer, data in rows:
        node = nodes[int(j)]
        assert (node.shard, node.grpc_address, node.raft, node.peer_address, node.data.name) == (
            int(shard), f"127.0.0.1:{grpc}", f"127.0.0.1:{raft}", f"127.0.0.1:{peer}", data)
        assert int(j) % 3 == int(member)
