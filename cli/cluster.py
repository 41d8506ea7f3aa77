"""``tickwheel cluster up`` and ``tickwheel cluster grow``: a local multi-process cluster
(`LocalCluster`) in the foreground, until Ctrl-C or SIGTERM (what ``docker stop``, systemd and
CI send) stops it and its nodes; and, from another terminal, more shards for it.

The rule it keeps: every node is started, and so stopped, by the ``cluster up`` process, those
of a growth too. ``cluster grow --shards N`` is a separate command because ``cluster up`` runs
in the foreground: it finds the running ``cluster up`` by its data folder (the layout it
recorded there, `tickwheel.cli.cluster_state`) and asks it over a Unix socket
(`tickwheel.cli.cluster_control`); ``cluster up`` starts the new shards' nodes with its own
credentials, Raft secret and port layout, waits for their leaders, then has the old shards take
the grown map (`Client.grow_shards`, what ``tickwheel grow-shards`` runs). `tickwheel.cli.main`
adds these commands to the node's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.table import Table

from tickwheel.cli.cluster_control import ControlServer, Reply, answering, ask
from tickwheel.cli.cluster_state import (
    CONTROL_SOCKET,
    STATE_FILE,
    ClusterState,
    growth_refusal,
    layout_refusal,
    read_state,
)
from tickwheel.client import Client
from tickwheel.harness.console_process import ConsoleProcess
from tickwheel.harness.local_cluster import LocalCluster, LocalNode
from tickwheel.node import console

DEFAULT_DATA = Path("data/cluster")
STARTING_TIMEOUT_S = 60.0
"""How long a growth waits for each new shard's leader, and for each old shard to take the map."""


def add_cluster_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cluster = commands.add_parser("cluster", help="a local multi-process cluster")
    actions = cluster.add_subparsers(dest="action", required=True)
    up = actions.add_parser("up", help="run a cluster on 127.0.0.1 until Ctrl-C or SIGTERM")
    up.add_argument("--nodes", type=int, default=3, help="replicas of each shard")
    up.add_argument("--shards", type=int, default=1,
                    help="independent Raft groups, each of --nodes replicas (docs/shards.md)")
    up.add_argument("--data", type=Path, default=DEFAULT_DATA)
    up.add_argument("--base-port", type=int, default=7400,
                    help="node j (shard j // NODES, member j %% NODES): gRPC on BASE+j, Raft on "
                         "BASE+100+j, peers on BASE+200+j, metrics on BASE+2000+j")
    up.add_argument("--insecure-grpc", action="store_true",
                    help="serve gRPC in plaintext to anyone (default: TLS and a token, made "
                         "under DATA/security)")
    up.add_argument("--rocketmq", action="store_true",
                    help="serve RocketMQ 5's client protocol too, on BASE+300+j (AccessKey "
                         "admin; its SecretKey: tickwheel rocketmq-key admin)")
    up.add_argument("--console", action="store_true",
                    help="run the web console too, on https://127.0.0.1:BASE+400/ (log in with "
                         "DATA/security/tokens/admin.token; docs/console.md)")
    up.set_defaults(handler=_cluster_up)
    grow = actions.add_parser(
        "grow", help="add shards to the cluster a running `cluster up` runs (docs/shards.md)")
    grow.add_argument("--shards", type=int, required=True,
                      help="how many shards the cluster is to have (more than it has)")
    grow.add_argument("--data", type=Path, default=DEFAULT_DATA,
                      help="the data folder of that `cluster up`")
    grow.set_defaults(handler=_cluster_grow)


def _cluster_up(args: argparse.Namespace) -> int:
    """Run the cluster until Ctrl-C or SIGTERM (both raise `KeyboardInterrupt` here), or until
    a node exits; the nodes are stopped by PID on the way out, whichever it was, those a
    growth started too. Between its checks of the nodes it answers ``cluster grow``."""
    for signum in (signal.SIGINT, signal.SIGTERM):  # SIGINT too: a parent may ignore it
        signal.signal(signum, signal.default_int_handler)
    data: Path = args.data.resolve()
    recorded = read_state(data)
    if recorded is not None and answering(Path(recorded.control)):
        return _refuse(f"a cluster up (pid {recorded.pid}) runs at {data} already")
    if args.console and args.insecure_grpc:
        return _refuse("--console serves HTTPS with the cluster's certificates: not with "
                       "--insecure-grpc")
    refusal = layout_refusal(recorded, args.shards, args.nodes, args.base_port)
    if refusal:
        return _refuse(f"{data}: {refusal}")
    data.mkdir(parents=True, exist_ok=True)
    cluster = LocalCluster(data, args.nodes, base_port=args.base_port, metrics=True,
                           insecure_grpc=args.insecure_grpc, rocketmq=args.rocketmq,
                           shards=args.shards, ledger_segment_age_ms=None)
    control = ControlServer(data / CONTROL_SOCKET)
    state = ClusterState(os.getpid(), str(control.path), args.nodes, args.shards,
                         args.base_port)
    if recorded is not None:  # the folder's cluster again, with the map it was grown to
        state = replace(state, map_version=recorded.map_version,
                        grown_from=recorded.grown_from, grown_at_ms=recorded.grown_at_ms)
        cluster.map_version, cluster.grown_from = state.map_version, state.grown_from
    state.write(data)
    running = _Running(cluster, data, state)
    try:
        with contextlib.closing(control), cluster, contextlib.ExitStack() as beside:
            _show(cluster, cluster.leaders(timeout_s=30))
            if args.console:
                _show_console(beside.enter_context(
                    ConsoleProcess(cluster, port=args.base_port + 400)))
            while all(node.alive() for node in cluster.nodes):
                control.serve(0.5, running.handle)
            console.print("[red]a node exited; stopping the cluster[/red]")
            return 1
    except KeyboardInterrupt:
        console.print("stopped")
    return 0


@dataclass
class _Running:
    """The cluster ``cluster up`` runs, as a growth changes it."""

    cluster: LocalCluster
    data: Path
    state: ClusterState
    unfinished: int = 0
    """The shards before a growth whose nodes run but which the old shards did not all take
    (0: none): ``cluster grow`` with the same count finishes it."""

    def handle(self, request: dict[str, Any], reply: Reply) -> None:
        """Answer one ``cluster grow`` request, ``{"grow_to": N}``."""
        wanted = request.get("grow_to")
        if not isinstance(wanted, int) or isinstance(wanted, bool):
            reply({"ok": False, "error": "the request names no grow_to (a number of shards)"})
            return
        try:
            reply({"ok": True, **self._grow(wanted, reply)})
        except _Refused as refused:
            reply({"ok": False, "refused": True, "error": str(refused)})
        except Exception as error:  # whatever failed, the cluster runs on and says so
            reply({"ok": False, "error": f"{error}; {self._after_failure(wanted)}"})

    def _grow(self, wanted: int, reply: Reply) -> dict[str, Any]:
        cluster, before = self.cluster, self.state.shards
        if self.unfinished and wanted != before:
            raise _Refused(f"the growth to {before} shards is not finished: run cluster grow "
                           f"--shards {before} first")
        if not self.unfinished:
            refusal = growth_refusal(self.state, wanted, int(time.time() * 1000))
            if refusal:
                raise _Refused(refusal)
            reply({"progress": f"starting shards {before}-{wanted - 1}: "
                               f"{(wanted - before) * cluster.size} nodes"})
            cluster.start_shards(wanted - before, STARTING_TIMEOUT_S)
            self.unfinished = before
            self._record(replace(self.state, shards=wanted, map_version=cluster.map_version,
                                 grown_from=cluster.grown_from))
        old, new = cluster.shards[:self.unfinished], cluster.shards[self.unfinished:]
        reply({"progress": f"shards {self.unfinished}-{wanted - 1} lead; shards "
                           f"0-{self.unfinished - 1} take the map (grow-shards)"})
        with Client([node.grpc_address for nodes in old for node in nodes],
                    credentials=cluster.credentials(), timeout_s=STARTING_TIMEOUT_S) as client:
            version = client.grow_shards([[n.grpc_address for n in nodes] for nodes in new],
                                         [[n.peer_address for n in nodes] for nodes in new])
        self.unfinished = 0
        self._record(replace(self.state, grown_at_ms=int(time.time() * 1000)))
        console.print(f"grown to {wanted} shards (shard map version {version})")
        _show(cluster, cluster.leaders(timeout_s=STARTING_TIMEOUT_S))
        return {"map_version": version, "shards": wanted,
                "nodes": [_described(cluster, node) for nodes in new for node in nodes]}

    def _after_failure(self, wanted: int) -> str:
        if self.unfinished:
            return (f"the new shards' nodes run: run cluster grow --shards {wanted} again to "
                    "finish the growth")
        return "the new nodes were stopped: nothing changed"

    def _record(self, state: ClusterState) -> None:
        self.state = state
        state.write(self.data)


class _Refused(Exception):
    """A growth that cannot start: nothing was changed."""


def _cluster_grow(args: argparse.Namespace) -> int:
    """Ask the ``cluster up`` of ``--data`` to grow to ``--shards``, and report its answer."""
    data: Path = args.data.resolve()
    state = read_state(data)
    if state is None:
        return _refuse(f"no tickwheel cluster up has run at {data} (it has no {STATE_FILE}): "
                       "start one with tickwheel cluster up --data DATA")
    try:
        for answer in ask(Path(state.control), {"grow_to": args.shards}):
            if "progress" in answer:
                console.print(answer["progress"], highlight=False)
            elif not answer["ok"]:
                console.print(f"[red]error[/red] {answer['error']}", highlight=False)
                return 2 if answer.get("refused") else 1
            else:
                _show_added(answer)
                return 0
    except (ConnectionRefusedError, FileNotFoundError):
        return _refuse(f"no tickwheel cluster up is running at {data}: the one that ran "
                       f"there (pid {state.pid}) has stopped")
    except (ConnectionError, TimeoutError) as error:
        console.print(f"[red]error[/red] {error}")
    return 1


def _refuse(why: str) -> int:
    console.print(f"[red]error[/red] {why}", highlight=False)
    return 2


def _described(cluster: LocalCluster, node: LocalNode) -> dict[str, Any]:
    return {"node": cluster.nodes.index(node), "shard": node.shard, "grpc": node.grpc_address,
            "raft": node.raft, "peer": node.peer_address, "pid": node.pid,
            "log": str(node.log_path)}


def _show_added(answer: dict[str, Any]) -> None:
    table = Table(title=f"shard map version {answer['map_version']}: {answer['shards']} shards; "
                        "nodes added (they stop with cluster up)")
    columns = ("node", "shard", "grpc", "raft", "peer", "pid", "log")
    for column in columns:
        table.add_column(column)
    for node in answer["nodes"]:
        table.add_row(*(str(node[column]) for column in columns))
    console.print(table)


def _show_console(console_process: ConsoleProcess) -> None:
    console.print(f"console: {console_process.url} (log in with the token in "
                  f"{console_process.token_file()}; log: {console_process.log_path})",
                  highlight=False, soft_wrap=True)


def _show(cluster: LocalCluster, leaders: list[LocalNode]) -> None:
    shards = len(cluster.shards)
    title = f"tickwheel: {len(cluster.nodes)}-node cluster" + (
        f", {shards} shards of {cluster.size}" if shards > 1 else "")
    table = Table(title=f"{title} (Ctrl-C stops it)")
    rocketmq = cluster.nodes[0].rocketmq_address is not None
    for column in ("node", *(("shard",) if shards > 1 else ()), "gRPC",
                   *(("RocketMQ",) if rocketmq else ()), "Raft", "metrics", "pid", "log"):
        table.add_column(column)
    for i, node in enumerate(cluster.nodes):
        table.add_row(f"{i}{' (leader)' if node in leaders else ''}",
                      *((str(node.shard),) if shards > 1 else ()), node.grpc_address,
                      *((node.rocketmq_address or "-",) if rocketmq else ()),
                      node.raft, node.metrics_address or "-", str(node.pid), str(node.log_path))
    console.print(table)
    targets = ",".join(node.grpc_address for node in cluster.nodes)
    environment = cluster.security.environment() if cluster.security else {
        "TICKWHEEL_INSECURE": "1"}
    console.print("try:\n  export " + " ".join(
        f"{name}={value}" for name, value in {"TICKWHEEL_TARGET": targets,
                                              **environment}.items())
        + "\n  tickwheel status", highlight=False, soft_wrap=True)
