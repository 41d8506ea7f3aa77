"""The ``tickwheel`` command (the console script): the node's commands
(`tickwheel.node.cli.commands`) and, from this layer above the harness, ``tickwheel cluster
up``: a local multi-process cluster (`LocalCluster`) in the foreground, until Ctrl-C or SIGTERM
(what ``docker stop``, systemd and CI send) stops it and its nodes."""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path

from rich.table import Table

from tickwheel.harness.local_cluster import LocalCluster, LocalNode
from tickwheel.node import console
from tickwheel.node import main as node_main


def main(argv: list[str] | None = None) -> int:
    return node_main(argv, more=_cluster_parser)


def _cluster_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cluster = commands.add_parser("cluster", help="a local multi-process cluster")
    up = cluster.add_subparsers(dest="action", required=True).add_parser("up")
    up.add_argument("--nodes", type=int, default=3, help="replicas of each shard")
    up.add_argument("--shards", type=int, default=1,
                    help="independent Raft groups, each of --nodes replicas (docs/shards.md)")
    up.add_argument("--data", type=Path, default=Path("data/cluster"))
    up.add_argument("--base-port", type=int, default=7400,
                    help="gRPC on BASE+i, Raft on BASE+100+i, peers on BASE+200+i, metrics "
                         "on BASE+2000+i")
    up.add_argument("--insecure-grpc", action="store_true",
                    help="serve gRPC in plaintext to anyone (default: TLS and a token, made "
                         "under DATA/security)")
    up.add_argument("--rocketmq", action="store_true",
                    help="serve RocketMQ 5's client protocol too, on BASE+300+i (AccessKey "
                         "admin; its SecretKey: tickwheel rocketmq-key admin)")
    up.set_defaults(handler=_cluster_up)


def _cluster_up(args: argparse.Namespace) -> int:
    """Run the cluster until Ctrl-C or SIGTERM (both raise `KeyboardInterrupt` here), or until
    a node exits; the nodes are stopped by PID on the way out, whichever it was."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    cluster = LocalCluster(args.data.resolve(), args.nodes, base_port=args.base_port,
                           metrics=True, insecure_grpc=args.insecure_grpc,
                           rocketmq=args.rocketmq, shards=args.shards)
    try:
        with cluster:
            _show(cluster, cluster.leaders(timeout_s=30))
            while all(node.alive() for node in cluster.nodes):
                time.sleep(0.5)
            console.print("[red]a node exited; stopping the cluster[/red]")
            return 1
    except KeyboardInterrupt:
        console.print("stopped")
    return 0


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
