"""The ``tickwheel`` command: the node's commands (`tickwheel.node.cli`) and, from this layer,
``tickwheel cluster up``: a local multi-process cluster (`LocalCluster`) until Ctrl-C."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.table import Table

from tickwheel.harness.local_cluster import LocalCluster
from tickwheel.node import console
from tickwheel.node import main as node_main


def main(argv: list[str] | None = None) -> int:
    return node_main(argv, more=_cluster_parser)


def _cluster_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cluster = commands.add_parser("cluster", help="a local multi-process cluster")
    up = cluster.add_subparsers(dest="action", required=True).add_parser("up")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--data", type=Path, default=Path("data/cluster"))
    up.add_argument("--base-port", type=int, default=7400,
                    help="gRPC on BASE+i, Raft on BASE+100+i, peers on BASE+200+i, metrics "
                         "on BASE+2000+i")
    up.add_argument("--insecure-grpc", action="store_true",
                    help="serve gRPC in plaintext to anyone (default: TLS and a token, made "
                         "under DATA/security)")
    up.set_defaults(handler=_cluster_up)


def _cluster_up(args: argparse.Namespace) -> int:
    cluster = LocalCluster(args.data.resolve(), args.nodes, base_port=args.base_port,
                           metrics=True, insecure_grpc=args.insecure_grpc)
    with cluster:
        leader = cluster.leader(timeout_s=30)
        table = Table(title=f"tickwheel: {args.nodes}-node cluster (Ctrl-C stops it)")
        for column in ("node", "gRPC", "Raft", "metrics", "pid", "log"):
            table.add_column(column)
        for i, node in enumerate(cluster.nodes):
            table.add_row(f"{i}{' (leader)' if node is leader else ''}", node.grpc_address,
                          node.raft, node.metrics_address or "-", str(node.pid),
                          str(node.log_path))
        console.print(table)
        targets = ",".join(node.grpc_address for node in cluster.nodes)
        environment = cluster.security.environment() if cluster.security else {
            "TICKWHEEL_INSECURE": "1"}
        console.print("try:\n  export " + " ".join(
            f"{name}={value}" for name, value in {"TICKWHEEL_TARGET": targets,
                                                  **environment}.items())
            + "\n  tickwheel status", highlight=False, soft_wrap=True)
        try:
            while all(node.alive() for node in cluster.nodes):
                time.sleep(0.5)
            console.print("[red]a node exited; stopping the cluster[/red]")
            return 1
        except KeyboardInterrupt:
            console.print("stopping")
    return 0
