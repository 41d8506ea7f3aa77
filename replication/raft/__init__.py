"""The Raft port: consensus for the replica, with everything of pysyncobj inside this package.

- `port`: what the replica needs (`RaftPort`, `RaftStatus`, `Role`), and nothing of how;
- `node`: `RaftNode`, the port on pysyncobj, and the traps it closes;
- `prevote`: the PreVote round pysyncobj lacks;
- `transport`, `wire`, `link_protocol`: the Raft port on the network, members only;
- `catch_up`: a follower installing a snapshot while its files are fetched, stepping on;
- `config`: `RaftConfig`; `journal`: the journal (compacted atomically, allocated before it
  is written, fsynced on request); `snapshot`: the snapshot file; `durability`: fsync helpers
  and the ledger of what syncs made durable (for the chaos runner's power cut).
"""

from tickwheel.replication.raft.config import MAX_MESSAGE_ENTRY_BYTES, InsecureCluster, RaftConfig
from tickwheel.replication.raft.durability import SyncLedger, fsync_files
from tickwheel.replication.raft.journal import (
    DISK_FULL,
    JOURNAL_FILE,
    journal_first_index,
    rewind_journal,
)
from tickwheel.replication.raft.node import PICKLE_PROTOCOL, RaftNode
from tickwheel.replication.raft.port import (
    OnResult,
    Prefetch,
    RaftPort,
    RaftStatus,
    Role,
    StepSummary,
    Taking,
)
from tickwheel.replication.raft.snapshot import (
    SNAPSHOT_FILE,
    SnapshotDamaged,
    read_snapshot,
    write_snapshot,
)

__all__ = ["DISK_FULL", "JOURNAL_FILE", "MAX_MESSAGE_ENTRY_BYTES", "PICKLE_PROTOCOL",
           "SNAPSHOT_FILE", "InsecureCluster", "OnResult", "Prefetch", "RaftConfig", "RaftNode",
           "RaftPort", "RaftStatus", "Role", "SnapshotDamaged", "StepSummary", "SyncLedger",
           "Taking", "fsync_files", "journal_first_index", "read_snapshot", "rewind_journal",
           "write_snapshot"]
