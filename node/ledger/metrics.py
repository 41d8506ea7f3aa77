"""The ledger's metrics, registered in the node's registry (`tickwheel.node.ops.metrics`):
rows written, rows dropped by reason, segments closed and deleted, bytes kept.

Updated by the ledger (`tickwheel.node.ledger.writer`) from its own thread, and for rows
dropped by a full buffer from whichever thread added them (prometheus-client's metrics are
thread-safe).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class LedgerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry or CollectorRegistry()
        self.rows = Counter("tickwheel_ledger_rows", "Rows written to the ledger's segments.",
                            registry=r)
        self.dropped = Counter("tickwheel_ledger_dropped_rows", "Rows the ledger dropped, by "
                               "reason (buffer_full, disk_low, write_failed); recorded as gaps "
                               "in the next segment.", ["reason"], registry=r)
        self.segments = Counter("tickwheel_ledger_segments", "Ledger segments closed.",
                                registry=r)
        self.deleted = Counter("tickwheel_ledger_deleted_segments", "Closed ledger segments "
                               "deleted, by reason (age, bytes).", ["reason"], registry=r)
        self.bytes = Gauge("tickwheel_ledger_bytes", "Bytes of the closed ledger segments "
                           "kept, with their indexes.", registry=r)
