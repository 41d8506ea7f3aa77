"""The production audit (``tickwheel audit DIR``, docs/audit.md): from the ledgers that
``tickwheel ledger fetch`` gathers, with PySpark, what happened to every message, shard by
shard: failovers and what they re-sent, overdue deliveries, sends early, after a cancel or
contrary to a reschedule, traffic and lateness per topic, group and hour, and the ledgers'
own gaps; with consumers' receipts, what they saw. The rule it keeps: only aggregates and
bounded id lists come back to the driver.

Modules: `layout` (the fetched folder, gaps), `lifecycle` (what was owed and what went
wrong), `leaders` (failovers, repeated hand-outs), `hourly` (traffic), `receipts` (what
consumers saw), `summary` (the figures, the verdict), `report` (Markdown, plots, terminal),
`command` (the command). Its face is used by ``tickwheel.cli`` (the subcommand), the chaos
audit (a chaos run is a production audit plus the runner's logs) and
``harness/audit_bench.py``. It reads the node's files, never the node's code: the layer sits
above ``node`` and below ``harness``.
"""

from tickwheel.audit.command import (
    add_arguments,
    build_session,
    jvm_output_to_stderr,
    main,
    run,
)
from tickwheel.audit.layout import (
    LEDGER_SCHEMA,
    Gap,
    Segments,
    fetched_segments,
    find_gaps,
    read_ledger,
)
from tickwheel.audit.summary import (
    AuditOptions,
    audit_ledgers,
    audit_segments,
    summarize,
    verdict,
)

__all__ = ["LEDGER_SCHEMA", "AuditOptions", "Gap", "Segments", "add_arguments",
           "audit_ledgers", "audit_segments", "build_session", "fetched_segments", "find_gaps",
           "jvm_output_to_stderr", "main",
           "read_ledger", "run", "summarize", "verdict"]
