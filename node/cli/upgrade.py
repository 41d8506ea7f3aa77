"""``tickwheel upgrade finalize``, and the cluster version line of ``tickwheel status``
(docs/replication.md#compatibility): after a rolling upgrade the cluster writes the formats of
the release before until an admin finalizes; `tickwheel.node.cli.commands` adds both.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from tickwheel.client import Client
from tickwheel.common.versions import describe
from tickwheel.node.cli.terminal import console


def add_upgrade_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser],
                       connection: argparse.ArgumentParser,
                       client: Callable[[argparse.Namespace], Client]) -> None:
    """``upgrade finalize``, connecting as the client commands do (``connection``)."""
    upgrade = commands.add_parser("upgrade", help="the cluster version after a rolling upgrade")
    steps = upgrade.add_subparsers(dest="step", required=True)
    finalize = steps.add_parser(
        "finalize", parents=[connection],
        help="write this release's formats from now on (an admin; no member can go back to "
             "the release before after it; refused while a member runs an older one)")
    finalize.set_defaults(handler=lambda args: _finalize(client(args)))


def _finalize(client: Client) -> int:
    with client:
        version = client.finalize_upgrade()
    console.print(f"cluster version {describe(version)}: finalized")
    return 0


def upgrade_line(cluster_version: int, member_versions: Sequence[int]) -> str:
    """What ``status`` says of the cluster version, from the leader's answer."""
    if not cluster_version:
        return "cluster version: not reported (the leader runs 0.0.4)"
    if member_versions and min(member_versions) > cluster_version:
        return (f"cluster version {describe(cluster_version)}; every member writes "
                f"{describe(min(member_versions))} or later: `tickwheel upgrade finalize` "
                "switches it on (no going back)")
    return f"cluster version {describe(cluster_version)}"
