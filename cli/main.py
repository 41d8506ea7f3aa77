"""The ``tickwheel`` command (the console script): the node's commands
(`tickwheel.node.cli.commands`) and, from this layer above the harness, ``tickwheel cluster
up`` and ``tickwheel cluster grow`` (`tickwheel.cli.cluster`): a local multi-process cluster in
the foreground, and more shards for it."""

from __future__ import annotations

from tickwheel.cli.cluster import add_cluster_commands
from tickwheel.node import main as node_main


def main(argv: list[str] | None = None) -> int:
    return node_main(argv, more=add_cluster_commands)
