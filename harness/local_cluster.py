"""A cluster of real node processes on 127.0.0.1, for tests, benchmarks and trying things out.

Each node is ``python -m tickwheel.node serve`` (the ``tickwheel serve`` command) in its own
process with its own data folder, as a user would start it; this module only starts, signals and
stops those processes (by PID) and talks to them over their public gRPC API.

The nodes share a random Raft secret, kept in ``ROOT/raft.secret`` (readable by its owner only;
an existing one is reused, so a cluster restarted on the same folder finds its members again)
and handed to each node as a file, never on its command line. They serve gRPC over TLS to
authenticated callers, with certificates and tokens made in ``ROOT/security``
(`tickwheel.node.security.dev_credentials`): `credentials` and `client` call as one of them.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import grpc

from tickwheel.client import Client, Credentials
from tickwheel.client.credentials import open_channel
from tickwheel.harness.ports import free_ports
from tickwheel.harness.processes import stop_process, wait_for
from tickwheel.node import (
    ADMIN_GRANTS,
    CLOCK_OFFSET_FILE,
    LEDGER_FOLDER,
    DevCredentials,
    Grants,
    ledger_segments,
    make_dev_credentials,
    read_ledger_rows,
    rocketmq_secret_key,
    write_clock_offset,
)
from tickwheel.v1 import tickwheel_pb2 as pb
from tickwheel.v1 import tickwheel_pb2_grpc as pb_grpc


def ensure_secret(path: Path) -> Path:
    """A file holding a random Raft secret, readable by its owner only; kept if it exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(secrets.token_urlsafe(32) + "\n")
    return path


POLLING_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 500))
"""The channel the harness polls a node through (`LocalNode.stub`): nodes start, restart and
die under it. With gRPC's own reconnect backoff (1 s, then 1.6 times longer up to 120 s), a
channel opened while its node was still starting went on failing for seconds after the node
served: 5 s for a node that took 9 s to start on a loaded machine, and `LocalCluster.leader`
timed out with a leader elected."""


LEDGER_SEGMENT_AGE_MS = 250
"""The nodes' ``--ledger-segment-age-ms`` unless told otherwise: a test reads what a running
node sent (`LocalNode.ledger`) within a quarter of a second, and a node killed loses at most
that much of its ledger."""
STARTING_S = 60.0
"""How long `LocalCluster.leader` gives nodes to answer at all before its own wait begins: a
node starts in two seconds here, and took ten on a machine loaded by parallel test workers and
other clusters, which ran out the 15 s a test allowed for an election."""


@dataclass
class LocalNode:
    raft: str
    grpc_address: str
    peer_address: str
    data: Path
    log_path: Path
    credentials: Credentials = field(repr=False)
    """How tests and tools reach it: as the cluster's admin."""
    metrics_address: str | None = None
    process: subprocess.Popen[bytes] | None = None
    clock_skew_ms: int = 0
    build: Path | None = None
    """The build the node runs: a folder put first on its ``PYTHONPATH`` (an unpacked wheel of
    another version); None for this one."""
    sync_ledger: Path | None = None
    """With it, the node runs with ``--fsync`` and notes there what each sync made durable
    (what `tickwheel.chaos.storage.power_cut` keeps)."""
    rocketmq_address: str | None = None
    """Where it serves RocketMQ's client protocol, if it does."""
    shard: int = 0
    """The shard whose Raft group it is a member of."""
    _channel: grpc.Channel | None = field(default=None, repr=False)
    _ledger_rows: dict[tuple[Path, int], list[dict[str, Any]]] = field(default_factory=dict,
                                                                      repr=False)

    @property
    def stub(self) -> pb_grpc.TickwheelStub:
        if self._channel is None:
            self._channel = open_channel(self.grpc_address, self.credentials, POLLING_OPTIONS)
        return pb_grpc.TickwheelStub(self._channel)

    @property
    def started(self) -> subprocess.Popen[bytes]:
        """The process the node last ran as; raise if it was never started."""
        if self.process is None:
            raise RuntimeError(f"node {self.raft} was never started")
        return self.process

    @property
    def pid(self) -> int:
        return self.started.pid

    def info(self, timeout_s: float = 1.0) -> pb.ClusterInfoResponse | None:
        try:
            return self.stub.ClusterInfo(pb.ClusterInfoRequest(), timeout=timeout_s)
        except grpc.RpcError:
            return None

    def ledger(self, event: str | None = None) -> list[dict[str, Any]]:
        """The rows of this node's closed ledger segments (of one ``event``, if given), oldest
        first: a running node's last ``--ledger-segment-age-ms`` are not in them yet. A
        segment is read once (closed, it never changes)."""
        rows = []
        for path in ledger_segments(self.data / LEDGER_FOLDER):
            key = (path, path.stat().st_ino)  # a wiped node's numbers begin again
            if key not in self._ledger_rows:
                self._ledger_rows[key] = read_ledger_rows(path)
            rows += self._ledger_rows[key]
        return rows if event is None else [row for row in rows if row["event"] == event]

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def step_clock(self, offset_ms: int, timeout_s: float) -> None:
        """Set this running node's clock to ``offset_ms`` from the machine's without a restart
        (it runs with ``--fault-injection``), and wait until its log says so; then remove the
        request, so that its next start takes the offset it is started with."""
        start = self.log_path.stat().st_size
        write_clock_offset(self.data, offset_ms)
        said = f"event=clock_stepped offset_ms={offset_ms} ".encode()

        def obeyed() -> bool:
            with open(self.log_path, "rb") as log:
                log.seek(start)
                return said in log.read()
        try:
            wait_for(obeyed, timeout_s, f"{self.raft} to step its clock to {offset_ms} ms",
                     poll_s=0.05)
        finally:
            (self.data / CLOCK_OFFSET_FILE).unlink(missing_ok=True)


class LocalCluster:
    """``size`` nodes under ``root`` for each of ``shards`` shards (Raft groups); a context
    manager that stops every process it started. Node ``i`` of shard ``k`` is
    ``nodes[k * size + i]``; its data is ``node{i}`` for shard 0, ``shard{k}-node{i}`` for
    another.

    Ports are free ones picked at random, or with ``base_port``: gRPC on ``base_port + j``, Raft
    on ``base_port + 100 + j``, the peer listener on ``base_port + 200 + j``, and (with
    ``metrics``) Prometheus on ``base_port + 2000 + j``, for the ``j``-th node of all.

    Principals beyond ``admin`` (every permission): ``principals`` maps names to grants
    (`tickwheel.node.security.dev_credentials`); ``client_certificates`` gives each a
    certificate too and makes the nodes require one (mutual TLS). ``insecure_grpc`` serves
    plaintext to anyone instead. ``power_cuts``: the nodes run with ``--fsync`` and keep a
    ledger of their syncs (`LocalNode.sync_ledger`), so that a power cut can be simulated.
    ``rocketmq``: the nodes serve RocketMQ's client protocol too (on ``base_port + 300 + i``),
    each principal's access key being its name.
    """

    def __init__(self, root: Path, size: int = 3, extra_args: tuple[str, ...] = (), *,
                 base_port: int | None = None, metrics: bool = False,
                 insecure_raft: bool = False, insecure_grpc: bool = False,
                 principals: dict[str, Grants] | None = None,
                 client_certificates: bool = False, power_cuts: bool = False,
                 rocketmq: bool = False, shards: int = 1,
                 ledger_segment_age_ms: int | None = LEDGER_SEGMENT_AGE_MS) -> None:
        self.size = size
        self._base_port = base_port
        self._metrics = metrics
        self._power_cuts = power_cuts
        self._rocketmq = rocketmq
        self.root = root
        self.security: DevCredentials | None = None
        self._client_certificates = client_certificates
        if insecure_grpc:
            self.grpc_args: tuple[str, ...] = ("--insecure-grpc",)
        else:
            self.security = make_dev_credentials(
                root / "security", principals={**ADMIN_GRANTS, **(principals or {})},
                client_certificates=client_certificates, rocketmq=rocketmq)
            self.grpc_args = self.security.node_flags(client_certificates)
        self.raft_args: tuple[str, ...] = (("--insecure-raft",) if insecure_raft
                          else ("--raft-secret-file", str(ensure_secret(root / "raft.secret"))))
        ledger_args = (() if ledger_segment_age_ms is None
                       else ("--ledger-segment-age-ms", str(ledger_segment_age_ms)))
        self.extra_args = (*ledger_args, *extra_args)
        """Flags for every node besides the addresses and ``raft_args`` and ``grpc_args``
        (how Raft links and gRPC are secured)."""
        self.map_version = 1
        """The shard map's version the nodes are started with: 1, plus 1 per `grow`."""
        self.grown_from = 0
        """How many shards the map had before the last `grow` (0: none)."""
        self.nodes: list[LocalNode] = []
        self.shards: list[list[LocalNode]] = []
        """The nodes of each shard."""
        self._add_shards(shards)

    def _add_shards(self, count: int) -> list[LocalNode]:
        """Make (not start) the nodes of ``count`` more shards."""
        first, size = len(self.nodes), count * self.size
        base_port = self._base_port
        if base_port is None:
            ports = free_ports(5 * size)
            grpc_ports, raft_ports, peer_ports, metrics_ports, rocketmq_ports = (
                ports[i * size:(i + 1) * size] for i in range(5))
        else:
            grpc_ports, raft_ports, peer_ports, rocketmq_ports, metrics_ports = (
                [base_port + offset + first + i for i in range(size)]
                for offset in (0, 100, 200, 300, 2000))
        admin = self.credentials()

        def name(i: int) -> str:
            shard, member = divmod(i, self.size)
            return f"node{member}" if shard == 0 else f"shard{shard}-node{member}"
        root = self.root
        added = [LocalNode(f"127.0.0.1:{raft_ports[j]}", f"127.0.0.1:{grpc_ports[j]}",
                           f"127.0.0.1:{peer_ports[j]}", root / name(i), root / f"{name(i)}.log",
                           admin, f"127.0.0.1:{metrics_ports[j]}" if self._metrics else None,
                           sync_ledger=root / f"node{i}.synced" if self._power_cuts else None,
                           rocketmq_address=(f"127.0.0.1:{rocketmq_ports[j]}" if self._rocketmq
                                             else None), shard=i // self.size)
                 for j, i in enumerate(range(first, first + size))]
        self.nodes += added
        self.shards += [added[k * self.size:(k + 1) * self.size] for k in range(count)]
        return added

    def start_shards(self, count: int, timeout_s: float = 60.0) -> list[list[LocalNode]]:
        """Start the nodes of ``count`` more shards with the grown map (the first step of a
        growth, docs/shards.md#growing-a-running-cluster) and wait for their leaders; the
        new shards' nodes. If one does not start, it stops those it started and leaves the
        cluster as it was (the old shards were told nothing yet) before it raises."""
        before, map_before = len(self.shards), (self.map_version, self.grown_from)
        added = self._add_shards(count)
        self.map_version, self.grown_from = self.map_version + 1, before
        try:
            for node in added:
                self.start(node)
            for shard in range(before, before + count):
                self.leader(timeout_s, shard=shard)
        except BaseException:
            for node in added:
                self.stop(node)
                if node._channel is not None:
                    node._channel.close()
            del self.nodes[-len(added):], self.shards[before:]
            self.map_version, self.grown_from = map_before
            raise
        return self.shards[before:]

    def grow(self, count: int, timeout_s: float = 60.0) -> int:
        """Add ``count`` shards to the running cluster, as an operator does: start their
        nodes (`start_shards`), then have the existing shards take the new map
        (`Client.grow_shards`, through the existing nodes). Returns the map's version."""
        with Client([node.grpc_address for node in self.nodes],
                    credentials=self.credentials()) as client:
            new = self.start_shards(count, timeout_s)
            return client.grow_shards([[node.grpc_address for node in nodes] for nodes in new],
                                      [[node.peer_address for node in nodes] for nodes in new])

    def credentials(self, principal: str = "admin") -> Credentials:
        """How to call the nodes as ``principal`` (its token, and its certificate when the
        cluster requires them)."""
        if self.security is None:
            return Credentials(insecure=True)
        cert_file, key_file = (self.security.client_certificate(principal)
                               if self._client_certificates else (None, None))
        return Credentials.load(ca_file=self.security.ca_file,
                                token_file=self.security.token_file(principal),
                                cert_file=cert_file, key_file=key_file)

    def rocketmq_secret_key(self, access_key: str = "admin") -> str:
        """The SecretKey of RocketMQ AccessKey ``access_key``, derived from the cluster's Raft
        secret as the nodes do (what ``tickwheel rocketmq-key`` prints)."""
        if not self.raft_args or self.raft_args[0] != "--raft-secret-file":
            raise ValueError("a cluster without a Raft secret signs no RocketMQ calls")
        raft_secret = Path(self.raft_args[1]).read_text().split()[0].encode()
        return rocketmq_secret_key(raft_secret, access_key)

    def client(self, principal: str = "admin", **options: float) -> Client:
        """A `Client` of every node, as ``principal``; ``options``: its timeouts."""
        return Client([node.grpc_address for node in self.nodes],
                      credentials=self.credentials(principal), **options)

    def __enter__(self) -> Self:
        for node in self.nodes:
            self.start(node)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def start(self, node: LocalNode, clock_skew_ms: int | None = None) -> None:
        if clock_skew_ms is not None:
            node.clock_skew_ms = clock_skew_ms
        members = [arg for addresses in self.members_of(node)
                   for arg in ("--member", "=".join(addresses))]
        command = [sys.executable, "-m", "tickwheel.node", "serve", "--raft-address", node.raft,
                   *members, "--data", str(node.data), "--metrics-listen",
                   node.metrics_address or "", *self.raft_args, *self.grpc_args,
                   *self.extra_args]
        if node.clock_skew_ms:  # a node that runs its clock off is one started for testing
            command += ["--clock-skew-ms", str(node.clock_skew_ms)]
            if "--fault-injection" not in self.extra_args:
                command.append("--fault-injection")
        if node.sync_ledger is not None:
            command += ["--fsync", "--sync-ledger", str(node.sync_ledger)]
        if node.rocketmq_address is not None:
            command += ["--rocketmq-listen", node.rocketmq_address]
        if self.map_version > 1:
            command += ["--shard-map-version", str(self.map_version),
                        "--grown-from", str(self.grown_from)]
        if len(self.shards) > 1:
            command += ["--shard", str(node.shard)]
            command += [arg for other in self.nodes if other.shard != node.shard
                        for arg in ("--shard-member", f"{other.shard}={other.grpc_address}"
                                                      f"={other.peer_address}")]
        node.data.mkdir(parents=True, exist_ok=True)
        env = None
        if node.build is not None:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                [str(node.build), *filter(None, [os.environ.get("PYTHONPATH")])])}
        with open(node.log_path, "ab") as log:
            node.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                            env=env)

    def members_of(self, node: LocalNode) -> list[tuple[str, str, str]]:
        """``(raft, grpc, peer)`` of every member of ``node``'s shard as ``node`` is told them
        (the same for every node here; the chaos runner puts proxies in between)."""
        return [(n.raft, n.grpc_address, n.peer_address) for n in self.shards[node.shard]]

    def signal(self, node: LocalNode, signum: int) -> None:
        os.kill(node.pid, signum)
        if signum == signal.SIGKILL:
            node.started.wait()

    def stop(self, node: LocalNode, timeout_s: float = 10.0) -> None:
        if not node.alive():
            return
        os.kill(node.pid, signal.SIGCONT)
        stop_process(node.started, timeout_s)

    def stop_all(self) -> None:
        for node in self.nodes:
            self.stop(node)
        for node in self.nodes:
            if node._channel is not None:
                node._channel.close()
                node._channel = None

    def running(self) -> Iterator[LocalNode]:
        return (node for node in self.nodes if node.alive())

    def leader(self, timeout_s: float = 15.0, among: list[LocalNode] | None = None,
               shard: int = 0) -> LocalNode:
        """The node that says it leads and dispatches, and that every other running node
        (of ``among``, else of ``shard``) follows. ``timeout_s`` counts from when each of them
        that runs answers (within `STARTING_S`): a node still starting is not a slow
        election."""
        candidates = among or [node for node in self.running() if node.shard == shard]

        def answering() -> bool:
            _check_running(candidates)
            return all(node.info() is not None for node in candidates if node.alive())

        def find() -> LocalNode | None:
            _check_running(candidates)
            infos = {node.raft: node.info() for node in candidates}
            for node in candidates:
                info = infos[node.raft]
                if (info is not None and info.role == "leader" and info.dispatching and all(
                        other is not None and other.leader_grpc == node.grpc_address
                        for other in infos.values())):
                    return node
            return None
        wait_for(answering, STARTING_S, "every running node to answer")
        return wait_for(find, timeout_s, "a leader that every running node follows")

    def leaders(self, timeout_s: float = 15.0) -> list[LocalNode]:
        """Every shard's leader (`leader`), in shard order."""
        return [self.leader(timeout_s, shard=shard) for shard in range(len(self.shards))]

    def placed(self, timeout_s: float = 30.0) -> list[LocalNode]:
        """Every shard's leader, once each is the member its shard prefers: shard k's
        (k mod size)-th (docs/shards.md), in a cluster of several shards. A cluster of one
        shard prefers none: its leader, whoever won."""
        if len(self.shards) == 1:
            return self.leaders(timeout_s)
        preferred = [members[k % self.size] for k, members in enumerate(self.shards)]
        return wait_for(lambda: preferred if self.leaders() == preferred else None,
                        timeout_s, "every shard to be led by the member it prefers")

    def schedule(self, messages: list[pb.Message], timeout_s: float = 20.0
                 ) -> pb.ScheduleResponse:
        """Schedule on whichever node leads, retrying across leader changes (safe: ids)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.leader(max(0.1, deadline - time.monotonic())).stub.Schedule(
                    pb.ScheduleRequest(messages=messages), timeout=10)
            except grpc.RpcError as error:
                if error.code() not in (grpc.StatusCode.UNAVAILABLE,
                                        grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                if time.monotonic() > deadline:
                    raise

    def deliveries(self) -> list[dict[str, Any]]:
        """Every node's ``sent`` ledger rows."""
        return [row for node in self.nodes for row in node.ledger("sent")]


def _check_running(nodes: list[LocalNode]) -> None:
    """Raise, with the tail of its log, if one of ``nodes`` exited (but by SIGKILL)."""
    for node in nodes:
        if node.process is not None and node.process.poll() not in (None, -9):
            tail = node.log_path.read_text()[-2_000:]
            raise RuntimeError(f"node {node.raft} exited with {node.process.returncode}:\n{tail}")
