"""The ``tickwheel`` command (the console script): the node's commands
(`tickwheel.node.cli.commands`) and, from this layer above the harness, ``tickwheel cluster
up`` and ``tickwheel cluster grow`` (`tickwheel.cli.cluster`): a local multi-process cluster in
the foreground, and more shards for it; ``tickwheel console`` (`tickwheel.cli.console`),
the web console; and ``tickwheel audit`` (`tickwheel.cli.audit`), the audit of fetched
ledgers."""

from __future__ import annotations

import argparse

from tickwheel.cli.audit import add_audit_command
from tickwheel.cli.cluster import add_cluster_commands
from tickwheel.cli.console import add_console_command
from tickwheel.node import main as node_main


def _more(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_cluster_commands(commands)
    add_console_command(commands)
    add_audit_command(commands)


def main(argv: list[str] | None = None) -> int:
    return node_main(argv, more=_more)
