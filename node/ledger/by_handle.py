"""Which message a handle names, from a node's ledger: the id the rows naming it carry.

A handle is where a message lives in the wheel, and a ledger row about it names it
(``handle``, or ``new_handle`` for a copy a reschedule or a retry filed); the ``scheduled``,
``cancelled``, ``rescheduled``, ``nacked``, ``dead_lettered`` and ``sent`` rows carry the id
too. Each closed segment's index (`tickwheel.node.ledger.index`) says which row groups hold a
handle's rows, so the search reads three columns of a few row groups per segment, newest
segment first, and stops at the first id (an index missing or stale is built first, as a
trace builds it). The open segment is not searched (close it first).

Called by the ``TraceMessage`` call given a handle (`tickwheel.node.api.ledger_calls`), on a
thread of its own: it reads files; the trace by that id follows (`tickwheel.node.ledger.trace`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from tickwheel.node.ledger.index import index_of
from tickwheel.node.ledger.schema import segments


def id_of_handle(folder: Path, handle: int) -> str | None:
    """The id of the message the wheel handle ``handle`` names in ``folder``'s closed
    segments, or None if no row carrying an id names it."""
    for path in reversed(segments(folder)):
        with contextlib.suppress(FileNotFoundError):  # deleted by retention meanwhile
            index = index_of(path)
            groups = set() if index is None else index.row_groups_of({handle})
            if not groups:
                continue
            table = pq.ParquetFile(path).read_row_groups(
                sorted(groups), columns=["id", "handle", "new_handle"])
            named = table.filter(pc.and_kleene(pc.is_valid(table["id"]), pc.or_kleene(
                pc.equal(table["handle"], handle), pc.equal(table["new_handle"], handle))))
            if named.num_rows:
                return str(named["id"][0].as_py())
    return None
