"""What ``tickwheel cluster up`` records in its data folder, so that ``tickwheel cluster grow``
(another process) finds the cluster it runs, and a later ``cluster up`` on the folder starts
the cluster it left (grown or not) rather than another one over its data.

The rule it keeps: a folder holds one cluster layout. ``DATA/cluster.json`` names the shards,
the replicas of each, the base port, the shard map's version and where the running
``cluster up`` listens for requests (`tickwheel.cli.cluster_control`); ``cluster up`` writes
it when it starts and after each growth (whole, by rename: a reader never sees half of it),
and refuses to start on a folder whose layout it would contradict. `tickwheel.cli.cluster`
(``cluster up`` and ``cluster grow``) calls it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from tickwheel.client.shards import MAX_SHARDS

STATE_FILE = "cluster.json"
"""The layout ``cluster up`` writes under its data folder."""
CONTROL_SOCKET = "control.sock"
"""Where a running ``cluster up`` listens for ``cluster grow``, under its data folder (when
the path fits a Unix socket's 107 bytes; else in a private folder the state file names)."""
PORTS_PER_KIND = 100
"""Nodes ``--base-port``'s layout has room for: gRPC on BASE+j, Raft on BASE+100+j, ..."""
GROWTH_WINDOW_MS = 600_000
"""How long after a growth each shard refuses the next: the dedupe window (10 minutes) of the
nodes ``cluster up`` starts (docs/shards.md, "Limits")."""


@dataclass(frozen=True)
class ClusterState:
    """One ``cluster up``'s cluster: node ``j`` of all (``j = shard * nodes + member``) serves
    gRPC on ``base_port + j``."""

    pid: int
    """The ``cluster up`` process that runs it (or ran it last)."""
    control: str
    """The Unix socket it answers ``cluster grow`` on."""
    nodes: int
    """Replicas of each shard."""
    shards: int
    base_port: int
    map_version: int = 1
    """The shard map's version its nodes were started with: 1, plus 1 per growth."""
    grown_from: int = 0
    """How many shards there were before the last growth (0: none)."""
    grown_at_ms: int = 0
    """When the last growth was done (Unix ms; 0: never)."""

    def write(self, data: Path) -> None:
        """Write it to ``data``, whole or not at all."""
        path = data / STATE_FILE
        written = path.with_suffix(".json.tmp")
        written.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(written, path)


def read_state(data: Path) -> ClusterState | None:
    """What ``cluster up`` last recorded in ``data``; None if it never ran there."""
    try:
        recorded = json.loads((data / STATE_FILE).read_text())
    except FileNotFoundError:
        return None
    return ClusterState(**recorded)


def layout_refusal(state: ClusterState | None, shards: int, nodes: int,
                   base_port: int) -> str | None:
    """Why ``cluster up`` with this layout must not start on a folder that recorded
    ``state``, or None: its nodes' Raft logs and maps name the recorded members, and another
    layout over the same data would split or orphan them."""
    if shards < 1 or nodes < 1:
        return "--shards and --nodes must be 1 or more"
    if shards * nodes > PORTS_PER_KIND:
        return (f"{shards} shards of {nodes} nodes are {shards * nodes} nodes: --base-port's "
                f"layout has room for {PORTS_PER_KIND}")
    if state is None or (state.shards, state.nodes, state.base_port) == (shards, nodes,
                                                                         base_port):
        return None
    grown = (f", grown from {state.grown_from} (map version {state.map_version})"
             if state.map_version > 1 else "")
    return (f"the folder holds a cluster of {state.shards} shards of {state.nodes} nodes on "
            f"base port {state.base_port}{grown}: run cluster up --shards {state.shards} "
            f"--nodes {state.nodes} --base-port {state.base_port}, or remove the folder to "
            "start a new cluster")


def growth_refusal(state: ClusterState, shards: int, now_ms: int) -> str | None:
    """Why growing the cluster of ``state`` to ``shards`` shards cannot start now, or None."""
    if shards <= state.shards:
        return (f"the cluster has {state.shards} shards already: --shards names how many it "
                f"is to have, more than {state.shards}")
    if shards > MAX_SHARDS:
        return f"--shards {shards} is more than a cluster may have ({MAX_SHARDS})"
    if shards * state.nodes > PORTS_PER_KIND:
        return (f"{shards} shards of {state.nodes} nodes are {shards * state.nodes} nodes: "
                f"--base-port's layout has room for {PORTS_PER_KIND}")
    if state.grown_at_ms and now_ms < state.grown_at_ms + GROWTH_WINDOW_MS:
        wait_s = -(-(state.grown_at_ms + GROWTH_WINDOW_MS - now_ms) // 1000)
        return (f"the cluster grew less than 10 minutes ago (the dedupe window, within which "
                f"each shard refuses another growth): grow again in {wait_s} s")
    return None
