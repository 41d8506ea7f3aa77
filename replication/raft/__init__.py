"""The Raft port: consensus for the replica, with everything of pysyncobj inside this package.

- `port`: what the replica needs (`RaftPort`, `RaftStatus`, `Role`), and nothing of how;
- `node`: `RaftNode`, the port on pysyncobj, and the traps it closes;
- `prevote`: the PreVote round pysyncobj lacks;
- `transport`, `wire`, `link_protocol`: the Raft port on the network, members only;
- `config`: `RaftConfig`; `files`: the journal (compacted atomically, allocated before it is
  written, fsynced on request) and the snapshot file.
"""

from tickwheel.replication.raft.config import MAX_MESSAGE_ENTRY_BYTES, InsecureCluster, RaftConfig
from tickwheel.replication.raft.files import (
    DISK_FULL,
    SnapshotDamaged,
    fsync_files,
    journal_first_index,
    read_snapshot,
    write_snapshot,
)
from tickwheel.replication.raft.node import PICKLE_PROTOCOL, RaftNode
from tickwheel.replication.raft.port import OnResult, RaftPort, RaftStatus, Role

__all__ = ["DISK_FULL", "MAX_MESSAGE_ENTRY_BYTES", "PICKLE_PROTOCOL", "InsecureCluster",
           "OnResult", "RaftConfig", "RaftNode", "RaftPort", "RaftStatus", "Role",
           "SnapshotDamaged", "fsync_files", "journal_first_index", "read_snapshot",
           "write_snapshot"]
