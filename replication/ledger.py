"""The ledger's side in the replication layer: what the state machine hands a node's ledger
as it applies each committed command, and the small protocol it hands it through.

Every replica (leader and followers) tells its ledger sink the lifecycle changes a command
*made*, in the order it applies them: messages scheduled, cancelled and rescheduled; leases
granted, acked, released and given back; retry copies filed after a nack or an expired lease
(``nacked``). A command that changed nothing (a cancel of a message already leased, an ack of
a stale receipt) gives no row. The rows carry the entry's ``stamp_ms`` (the leader's clock
when it proposed it) and the replicated handles, never a receipt or a client's handle.

The rule this module keeps: the Raft thread does no more per message than the state machine
already does. A hook hands over *columns* (lists the apply built anyway, or one list
comprehension over the command's rows) in one `LedgerRows`; wheel records are handed over
whole, and their ids, topics and attempts are read later, on the ledger's own thread, by
`record_columns`. The sink must not block: the node's ledger (`tickwheel.node.ledger`)
buffers and drops, counted, rather than wait.

Callers: `StateMachine`, `Scheduling` and `Retiring` through `Stores.ledger`, set by
`Replica` from what `tickwheel.node.serve` gives it; the node's courier sends its own rows
(``sent``, ``dispatch_started``) through the same protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from tickwheel.wheel.format import decode_record_key


class LedgerRows(NamedTuple):
    """Rows of one event kind, as columns: every list in ``columns`` has one value per row
    (named as the ledger's schema names them, `tickwheel.node.ledger.schema`)."""

    event: str
    time_ms: int
    """The cluster's time of every row: a committed command's stamp, a send's time."""
    columns: dict[str, Sequence[Any]]
    records: Sequence[bytes] | None = None
    """Wheel records, one per row, whose ``id``, ``topic`` and ``attempt`` the ledger's thread
    reads (`record_columns`); None when ``columns`` holds what the rows need."""

    @property
    def size(self) -> int:
        """How many rows."""
        if self.records is not None:
            return len(self.records)
        return len(next(iter(self.columns.values()))) if self.columns else 0


class LedgerSink(Protocol):
    """Where a replica and a courier hand their rows. `add` is called from the Raft thread
    and the event loop, and must return at once."""

    def add(self, rows: LedgerRows) -> None: ...


def record_columns(records: Sequence[bytes]) -> tuple[list[str], list[str], list[int]]:
    """The ids, topics and attempts of wheel records (for the ledger's thread: each record's
    CRC checked, its properties and body not read)."""
    ids: list[str] = []
    topics: list[str] = []
    attempts: list[int] = []
    for record in records:
        message_id, topic, attempt = decode_record_key(record)
        ids.append(message_id)
        topics.append(topic)
        attempts.append(attempt)
    return ids, topics, attempts
