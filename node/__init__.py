"""The process: gRPC server, consumer delivery, config, CLI, metrics, in rooms by concern,
each importing only the rooms below it (pyproject.toml's contracts)::

    cli/          the node's commands of ``tickwheel`` (``cluster up`` is added from above)
    serve         assembles one node and runs it until SIGTERM
    settings/     every setting, from flags, TICKWHEEL_*, TOML and defaults
    listeners     the gRPC servers bound to their ports (client, peer, RocketMQ, health)
    rocketmq/     RocketMQ 5's client protocol, served through the API
    api/          the gRPC API: calls, forwarding, admission, validation
    delivery/     the Courier, consumers' streams, receipts, retries
    ledger/       the ledger: the committed lifecycle and this node's sends, in Parquet
    ops/ security/ peers   metrics, disk, memory; who calls and with what grants;
                  state files read from peers (the lowest, independent of each other)

The face the layers above use, each name for the users it has (code above imports these from
here, never a module inside; `tests/test_layout.py` checks it):

- `main` and `console`: the node's commands, and the terminal they print to, which
  `tickwheel.cli` extends with ``cluster up`` and prints to alike;
- `LEDGER_FOLDER`, `ledger_segments` and `read_ledger_rows`: where a node keeps its ledger,
  its closed segments oldest first (which the chaos runner collects for the audit), and
  their rows (which the harness reads); `Ledger` and `LedgerConfig`, its writer, with which
  the trace benchmark (`tickwheel.harness.trace_bench`) writes a node's ledger before it starts
  and the writer's (`tickwheel.harness.ledger_writer_bench`) measures it;
  `LEDGER_SCHEMA`, `LedgerManifest` and `ledger_node_token`: the segments' Arrow schema, their
  manifest and the node's name in their names, with which the audit's benchmark
  (`tickwheel.harness.audit_bench`) writes a synthetic ledger;
- `DEFAULT_RESERVE_BYTES` and `free_bytes`: the disk reserve a node keeps and how it measures
  free space, so that the chaos runner's full disk is full as the node sees it;
- `make_dev_credentials`, `DevCredentials`, `Grants`, `ADMIN_GRANTS`: the development
  credentials the node's ``tickwheel certs`` command makes, which `LocalCluster` runs its nodes
  and callers with;
- `write_clock_offset` and `CLOCK_OFFSET_FILE`: a live clock step, for the chaos runner's
  ``clock-step`` fault (a node started with ``--fault-injection`` reads it; others refuse it);
- `rocketmq_secret_key`: the SecretKey a RocketMQ client signs with, derived from the cluster's
  Raft secret as the node's ``tickwheel rocketmq-key`` does, for the harness's RocketMQ clients.

The exit codes of a node, and what each says, are one table: `tickwheel.common.exits`.

Importing the face does not load the server: a process that needs the credentials (a
benchmark's consumer beside RocketMQ's official client, whose protos would clash with ours)
loads none of it, since ``tickwheel serve`` imports the server when it runs
(`tickwheel.node.cli.serve`).
"""

from tickwheel.node.cli.commands import main
from tickwheel.node.cli.terminal import console
from tickwheel.node.ledger import LEDGER_FOLDER
from tickwheel.node.ledger import read_rows as read_ledger_rows
from tickwheel.node.ledger import segments as ledger_segments
from tickwheel.node.ledger.schema import SCHEMA as LEDGER_SCHEMA
from tickwheel.node.ledger.schema import Manifest as LedgerManifest
from tickwheel.node.ledger.schema import node_token as ledger_node_token
from tickwheel.node.ledger.writer import Ledger, LedgerConfig
from tickwheel.node.ops.clock_step import CLOCK_OFFSET_FILE, write_clock_offset
from tickwheel.node.ops.disk import DEFAULT_RESERVE_BYTES, free_bytes
from tickwheel.node.rocketmq.signature import secret_key as rocketmq_secret_key
from tickwheel.node.security.dev_credentials import ADMIN as ADMIN_GRANTS
from tickwheel.node.security.dev_credentials import DevCredentials, Grants
from tickwheel.node.security.dev_credentials import make as make_dev_credentials

__all__ = [
    "ADMIN_GRANTS",
    "CLOCK_OFFSET_FILE",
    "DEFAULT_RESERVE_BYTES",
    "LEDGER_FOLDER",
    "LEDGER_SCHEMA",
    "DevCredentials",
    "Grants",
    "Ledger",
    "LedgerConfig",
    "LedgerManifest",
    "console",
    "free_bytes",
    "ledger_node_token",
    "ledger_segments",
    "main",
    "make_dev_credentials",
    "read_ledger_rows",
    "rocketmq_secret_key",
    "write_clock_offset",
]
