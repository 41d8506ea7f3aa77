"""The cluster under test: real ``tickwheel serve`` processes whose Raft links run through the
runner's proxies (`RaftMesh`), with the faults the nemeses need.

Each node keeps its ledger in its data folder. The ledgers are gathered into one folder,
``OUT/ledgers``, in the layout ``tickwheel ledger fetch`` writes and the audit reads
(``shard-<s>/<node>/ledger-<node>-<sequence>.parquet``, ``<node>`` the token of the node's
Raft address): at the end of the run, while the nodes still run, by that very command
(`fetch_ledgers`, as the cluster's admin, with ``--close-open``); before a node's data is
wiped, by copying its closed segments, which no fetch could reach afterwards, into
``shard-<s>/<node>.generation-<g>/`` (the wiped node starts its sequence numbers again, so
each generation is a folder, a node, of its own). At the end each node's log (every
generation's, one file) is copied to ``OUT/logs/<name>.log``: what explains a slow failover
(its elections) outlives the cluster's folder. Used by `tickwheel.chaos.runner`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Final

from tickwheel.chaos import storage
from tickwheel.chaos.proxy import RaftMesh
from tickwheel.chaos.storage import MountFailed, PowerCut, mount_disk, unmount_disk
from tickwheel.harness.local_cluster import LocalCluster, LocalNode
from tickwheel.harness.ports import free_ports
from tickwheel.harness.processes import wait_for
from tickwheel.node import LEDGER_FOLDER, ledger_node_token, ledger_segments
from tickwheel.replication.raft import SyncLedger

FETCH_TIMEOUT_S: Final = 300.0
"""How long one ``tickwheel ledger fetch`` of a run's ledgers may take (a 10-minute run's
are a few tens of MiB a node)."""
FETCH_RETRY_S: Final = 60.0
"""How long `ChaosCluster.fetch_ledgers` goes on fetching again while a node is missed (one
just restarted may not serve yet); a fetch again takes only what is new."""


class ChaosCluster(LocalCluster):
    """``size`` nodes under ``root`` for each of ``shards`` shards, each shard behind a
    `RaftMesh` of its own; ledgers are collected in ``ledgers``. A node is named after its data
    folder (``node1``, ``shard1-node2``). A context manager: it stops every process it
    started, then the proxies."""

    def __init__(self, root: Path, size: int, ledgers: Path,
                 extra_args: tuple[str, ...] = (), disk_size: str | None = None,
                 power_cuts: bool = False, shards: int = 1) -> None:
        """``disk_size`` (``"512m"``): give each node a tmpfs of its own of that size, a disk
        that can fill up (mounting needs root). ``power_cuts``: run the nodes with ``--fsync``
        and a ledger of their syncs, so that `power_cut` can drop what they did not sync."""
        super().__init__(root, size, ("--fault-injection", *extra_args), power_cuts=power_cuts,
                         shards=shards)
        self._disk_size = disk_size
        self._mounted: list[Path] = []
        ports = free_ports(shards * (size + size * (size - 1) // 2))
        per_mesh = len(ports) // shards
        self.meshes = [RaftMesh(mesh_ports[:size], mesh_ports[size:])
                       for mesh_ports in (ports[k * per_mesh:(k + 1) * per_mesh]
                                          for k in range(shards))]
        """Each shard's proxies."""
        for members, mesh in zip(self.shards, self.meshes, strict=True):
            for index, node in enumerate(members):
                node.raft = mesh.address(index)
        self.names = {node.raft: node.data.name for node in self.nodes}
        self.ledgers = ledgers
        self._generation = dict.fromkeys(self.names.values(), 0)

    def __enter__(self) -> ChaosCluster:
        for mesh in self.meshes:
            mesh.start()
        try:
            if self._disk_size is not None:
                for node in self.nodes:
                    self._mount(node.data, self._disk_size)
            return super().__enter__()
        except BaseException:
            self._stop_meshes()
            self._unmount()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop_all()
            self.collect_logs()
        finally:
            self._stop_meshes()
            self._unmount()

    def _stop_meshes(self) -> None:
        for mesh in self.meshes:
            mesh.stop()

    def _mount(self, folder: Path, size: str) -> None:
        try:
            mount_disk(folder, size)
        except MountFailed as error:
            raise RuntimeError(f"the disk-full fault gives each node a tmpfs of its own, and "
                               f"{error}: run as root, or leave the fault out") from None
        self._mounted.append(folder)

    def _unmount(self) -> None:
        for folder in self._mounted:
            unmount_disk(folder)
        self._mounted.clear()

    def members_of(self, node: LocalNode) -> list[tuple[str, str, str]]:
        members = self.shards[node.shard]
        seen = self.meshes[node.shard].members_of(members.index(node))
        return [(raft, other.grpc_address, other.peer_address)
                for raft, other in zip(seen, members, strict=True)]

    def name(self, node: LocalNode) -> str:
        return self.names[node.raft]

    # -- faults -----------------------------------------------------------------------------

    def kill(self, node: LocalNode) -> None:
        self.signal(node, signal.SIGKILL)

    def pause(self, node: LocalNode) -> None:
        self.signal(node, signal.SIGSTOP)

    def resume(self, node: LocalNode) -> None:
        self.signal(node, signal.SIGCONT)

    def isolate(self, node: LocalNode, mode: str = "reset") -> None:
        self.meshes[node.shard].isolate(self.shards[node.shard].index(node), mode)

    def heal(self, shard: int) -> None:
        self.meshes[shard].heal()

    def power_cut(self, node: LocalNode) -> PowerCut:
        """Drop every byte a killed node had not synced."""
        assert node.sync_ledger is not None, "the cluster was not started for power cuts"
        return storage.power_cut(node.data, SyncLedger(node.sync_ledger))

    def wipe(self, node: LocalNode) -> None:
        """Delete a stopped node's data (its ledger's closed segments are kept: the next
        generation starts); the folder stays (it may be a mount)."""
        self.keep_ledger(node)
        self._generation[self.name(node)] += 1
        for entry in node.data.iterdir():
            if entry.is_dir() and not entry.is_symlink():  # DATA/state is a link
                shutil.rmtree(entry)
            else:
                entry.unlink()
        if node.sync_ledger is not None:  # its notes name files that are gone
            shutil.rmtree(node.sync_ledger, ignore_errors=True)

    def collect_logs(self) -> None:
        """Copy every node's log to ``logs/<name>.log`` beside the ledgers."""
        logs = self.ledgers.parent / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            if node.log_path.exists():
                shutil.copyfile(node.log_path, logs / f"{self.name(node)}.log")

    def keep_ledger(self, node: LocalNode) -> None:
        """Copy a stopped ``node``'s closed ledger segments, with their manifests, into
        ``shard-<s>/<node>.generation-<g>/`` (a killed node's open segment is torn: not one of
        them)."""
        name = self.name(node)
        into = self.ledgers / f"{self._fetched_folder(node)}.generation-{self._generation[name]}"
        for segment in ledger_segments(node.data / LEDGER_FOLDER):
            into.mkdir(parents=True, exist_ok=True)
            for path in (segment, segment.with_suffix(".json")):
                if path.exists():
                    shutil.copyfile(path, into / path.name)

    def fetch_ledgers(self) -> int:
        """Run ``tickwheel ledger fetch --close-open`` into `ledgers`, as a user runs it (the
        admin's ``TICKWHEEL_*`` variables, every node as a target), again while it misses a
        node, for up to `FETCH_RETRY_S`; returns its last exit status (0: every node
        fetched, its last rows too)."""
        command = [sys.executable, "-m", "tickwheel.cli", "ledger", "fetch", "--target",
                   ",".join(node.grpc_address for node in self.nodes), "--out",
                   str(self.ledgers), "--close-open", "--quiet"]
        environment = {name: value for name, value in os.environ.items()
                       if not name.startswith("TICKWHEEL_")} | self._admin_environment()
        status: list[int] = []

        def fetched() -> bool:
            status.append(subprocess.run(command, env=environment, stdout=subprocess.DEVNULL,
                                         timeout=FETCH_TIMEOUT_S, check=False).returncode)
            return status[-1] == 0
        with contextlib.suppress(TimeoutError):  # the status says so
            wait_for(fetched, FETCH_RETRY_S, "a ledger fetch that reaches every node", 1.0)
        return status[-1]

    def ledger_folders(self, node: LocalNode) -> list[str]:
        """``node``'s folders under `ledgers` (relative to it): each wiped generation's,
        oldest first, then the fetched one."""
        fetched = self._fetched_folder(node)
        kept = [f"{fetched}.generation-{generation}"
                for generation in range(self._generation[self.name(node)])]
        return [folder for folder in (*kept, fetched) if (self.ledgers / folder).is_dir()]

    def _fetched_folder(self, node: LocalNode) -> str:
        """Where ``ledger fetch`` puts ``node``'s segments, relative to `ledgers`."""
        return f"shard-{node.shard}/{ledger_node_token(node.raft)}"

    def _admin_environment(self) -> dict[str, str]:
        """The ``TICKWHEEL_*`` variables that make the command the cluster's admin."""
        if self.security is None:
            return {"TICKWHEEL_INSECURE": "1"}
        return self.security.environment()
