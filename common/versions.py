"""Cluster versions: which formats a cluster writes, so that a release and the one before it
run together in both directions until an operator says the upgrade is done.

A *cluster version* names a set of formats: of Raft entries (the command kinds and their
layouts), of snapshots, of the wheel's files and of what members send each other. Every
member writes only formats of the cluster's version, a replicated number (the ``finalize``
command sets it; a snapshot carries it). A cluster upgraded from an older release keeps that
release's version, so any member can go back to that release, until an admin runs
``tickwheel upgrade finalize``: the leader then checks that every member answers with a
version at least this build's and proposes it; from that entry on the new formats are
written, and a member of the older release can no longer join.

The rule that keeps it: nothing this build writes before the cluster reaches a version needs
that version to be read; each format introduced since `BASELINE` is named with the version
that switches it on (`SHARD_MAP_VERSION`, `PRINCIPAL_VERSION`). While `CURRENT` is still
unreleased (`RELEASES`), a format added to this build joins it: no release wrote version 2 yet,
so no member can hold a version 2 without it. A cluster whose first leader runs this build (a new
cluster: its log had no handle key yet) starts at `CURRENT` at once, as Kafka formats a new
cluster at its release's ``metadata.version``.

Members learn each other's versions from Raft: every answer to an AppendEntries carries the
answering node's `CURRENT` (`tickwheel.replication.raft.versions`), an answer without one is a
node of `BASELINE`. The server, the client library and the command read these names from here.
"""

from __future__ import annotations

from typing import Final

from tickwheel.common.errors import VersionConflict

BASELINE: Final = 1
"""The formats of release 0.0.4 (and of every build after it until cluster versions): a node
of 0.0.4 reads a cluster held at this version."""
CURRENT: Final = 2
"""The formats of this build: version 1's, plus the ``shard_map`` command (a shard map grown
while the cluster runs), the snapshot's shard map and cluster version, and the schedule, cancel
and move commands that carry who asked (``schedule_by``, ``cancel_by``, ``move_by``)."""
SHARD_MAP_VERSION: Final = 2
"""From this version on the cluster may write ``shard_map`` commands (``GrowShards``), and
snapshots carry the shard map and the cluster version."""
PRINCIPAL_VERSION: Final = 2
"""From this version on schedules, cancels and moves are written as ``schedule_by``,
``cancel_by`` and ``move_by`` commands, which carry the caller's principal for every
replica's ledger (`tickwheel.replication.commands`); before it, as 0.0.4 writes them,
without one."""
RELEASES: Final = {BASELINE: "0.0.4", CURRENT: "unreleased"}
"""The release that introduced each version's formats (for messages and ``tickwheel
status``)."""


def describe(version: int) -> str:
    """``version`` with its release, as messages and tables show it: ``1 (0.0.4)``."""
    release = RELEASES.get(version)
    return f"{version} ({release})" if release else f"{version} (newer than this build)"


def require(cluster_version: int, version: int, what: str) -> None:
    """Raise `VersionConflict` unless a cluster at ``cluster_version`` writes ``version``'s
    formats (``what`` names what would need them)."""
    if cluster_version < version:
        raise VersionConflict("cluster_version", f"{what} needs cluster version "
                              f"{describe(version)}; the cluster writes "
                              f"{describe(cluster_version)} until an admin runs `tickwheel "
                              "upgrade finalize` (docs/replication.md#compatibility)")
