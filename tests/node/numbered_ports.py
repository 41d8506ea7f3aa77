"""The ports tests give ``tickwheel cluster up`` (and the documented growth by hand) by
number: a node ``j`` of such a cluster takes ``base + j`` (gRPC), ``+ 100`` (Raft), ``+ 200``
(peer), ``+ 300`` (RocketMQ), ``+ 400`` (the console) and ``+ 2000`` (metrics), for ``j`` up
to 19 (harness/local_cluster.py).

Each test that starts one has a block of its own (`base_port`), above the slices of ports the
parallel workers pick from (tests/conftest.py: below the upgrade fixture's 27400) and below
the kernel's ephemeral ports (32768 and up on Linux). Chosen at random from 30000-38000, a
growth once found its port taken by some process's outgoing connection, which takes its local
port from the ephemeral range."""

from __future__ import annotations

FIRST = 27_700
"""Above the upgrade fixture's ports (27400, 27500, 27600, 29400)."""
BLOCK = 20
SLOTS = ("cluster_up", "cluster_up_rocketmq", "cluster_up_console", "cluster_grow",
         "growth_by_hand")


def base_port(slot: str) -> int:
    """The base port of the test named by ``slot`` (one of `SLOTS`)."""
    return FIRST + BLOCK * SLOTS.index(slot)
