"""The process: gRPC server, consumer delivery, config, CLI, metrics (issue 4), in rooms by
concern (issue 38), each importing only the rooms below it (pyproject.toml's contracts)::

    cli/          the node's commands of ``tickwheel`` (``cluster up`` is added from above)
    serve         assembles one node and runs it until SIGTERM
    settings/     every setting, from flags, TICKWHEEL_*, TOML and defaults
    listeners     the gRPC servers bound to their ports (client, peer, RocketMQ, health)
    rocketmq/     RocketMQ 5's client protocol, served through the API
    api/          the gRPC API: calls, forwarding, admission, validation
    delivery/     the Courier, consumers' streams, receipts, retries, the delivery journal
    ops/ security/ peers   metrics, disk, memory; who calls and with what grants;
                  state files read from peers (the lowest, independent of each other)

The face the layers above use (`tickwheel.cli`, `tickwheel.harness`, `tickwheel.chaos`): the
node's commands (`main`, and the `console` they print to), how a node says its storage failed
(`EXIT_STORAGE`), the disk reserve it keeps and how it measures free space, the files of its
delivery journal (`journal_files`), a live clock step for fault injection
(`write_clock_offset`), the development credentials a local cluster runs with, and
the SecretKey a RocketMQ client signs with. Code above imports these from here, never a module
inside; `tests/test_layout.py` checks it.

Importing the face does not load the server: a process that needs the credentials (a
benchmark's consumer beside RocketMQ's official client, whose protos would clash with ours)
loads none of it, since ``tickwheel serve`` imports the server when it runs
(`tickwheel.node.cli.serve`).
"""

from tickwheel.node.cli.commands import main
from tickwheel.node.cli.terminal import console
from tickwheel.node.delivery.journal import files as journal_files
from tickwheel.node.ops.clock_step import CLOCK_OFFSET_FILE, write_clock_offset
from tickwheel.node.ops.disk import DEFAULT_RESERVE_BYTES, free_bytes
from tickwheel.node.rocketmq.signature import secret_key as rocketmq_secret_key
from tickwheel.node.security.dev_credentials import ADMIN as ADMIN_GRANTS
from tickwheel.node.security.dev_credentials import DevCredentials, Grants
from tickwheel.node.security.dev_credentials import make as make_dev_credentials

# The status `tickwheel.node.serve` exits with (its `EXIT_STORAGE`), taken from where it is
# defined so that the face does not load the server.
from tickwheel.replication import STORAGE_EXIT_CODE as EXIT_STORAGE

__all__ = [
    "ADMIN_GRANTS",
    "CLOCK_OFFSET_FILE",
    "DEFAULT_RESERVE_BYTES",
    "EXIT_STORAGE",
    "DevCredentials",
    "Grants",
    "console",
    "free_bytes",
    "journal_files",
    "main",
    "make_dev_credentials",
    "rocketmq_secret_key",
    "write_clock_offset",
]
