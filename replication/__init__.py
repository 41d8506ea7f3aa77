"""The Raft state machine over the wheel: group commit, cursor sync, lease, hand-over.

Its face, what the layers above use: the `Replica` (the one object a node drives) with its
settings and status (its Raft thread's steps too, `StepSummary`); what its calls answer
(`Accepted`, `Rejected`, `Retried`, `MoveOutcome`;
`Delivery` and `Expired` for the hand-out it makes); the cluster's time it reads
(`ClusterClock`, `MemberOffset`); lease receipts (`LeaseRef`,
`encode_receipt`, `encode_receipts`, `decode_receipt`); the shard map a command set
(`ShardMapRecord`); the rows it tells a ledger (`LedgerRows`, `LedgerSink`,
`record_columns`); consumer groups (`Groups`, read-only
above), their names and kinds; the handle cipher. The Raft port has its own face,
`tickwheel.replication.raft`. Nothing outside this package imports its other modules
(tests/test_layout.py checks it).
"""

from tickwheel.replication.cluster_clock import ClusterClock, MemberOffset
from tickwheel.replication.commands import LeaseRef
from tickwheel.replication.config import ReplicaConfig
from tickwheel.replication.dispatcher import Delivery, DispatchConfig, Expired
from tickwheel.replication.group import DEFAULT_GROUP, DURABLE, STREAM, GroupSummary
from tickwheel.replication.groups import Groups
from tickwheel.replication.handle_cipher import HandleCipher
from tickwheel.replication.handout import (
    TARGET_GROUP_PROPERTY,
    ConsumerSlot,
    decode_receipt,
    encode_receipt,
    encode_receipts,
)
from tickwheel.replication.ledger import LedgerRows, LedgerSink, record_columns
from tickwheel.replication.outcomes import Accepted, MoveOutcome, Rejected, Retried
from tickwheel.replication.raft import StepSummary
from tickwheel.replication.replica import Replica
from tickwheel.replication.state import StateConfig
from tickwheel.replication.state_files import ShardMapRecord
from tickwheel.replication.status import ReplicaStatus

__all__ = [
    "DEFAULT_GROUP",
    "DURABLE",
    "STREAM",
    "TARGET_GROUP_PROPERTY",
    "Accepted",
    "ClusterClock",
    "ConsumerSlot",
    "Delivery",
    "DispatchConfig",
    "Expired",
    "GroupSummary",
    "Groups",
    "HandleCipher",
    "LeaseRef",
    "LedgerRows",
    "LedgerSink",
    "MemberOffset",
    "MoveOutcome",
    "Rejected",
    "Replica",
    "ReplicaConfig",
    "ReplicaStatus",
    "Retried",
    "ShardMapRecord",
    "StateConfig",
    "StepSummary",
    "decode_receipt",
    "encode_receipt",
    "encode_receipts",
    "record_columns",
]
