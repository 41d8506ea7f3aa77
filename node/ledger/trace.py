"""One message's rows in this node's ledger, found through the segments' indexes.

Rows other than ``scheduled``, ``cancelled``, ``rescheduled``, ``nacked``, ``dead_lettered``
and ``sent`` carry no id, only a ``handle``; so `trace` finds the id's handles first (its
copies' too: a rescheduled or retried copy's ``new_handle`` is indexed under the id), then
every row naming one of those handles. Each closed segment's index (`tickwheel.node.ledger
.index`) says which row groups to read, so a trace reads a few row groups per segment,
never the whole ledger. The open segment is not read (its footer is not written yet).

Called by the ``TraceMessage`` call (`tickwheel.node.api.ledger_calls`), on a thread of its
own: it reads files.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tickwheel.node.ledger.index import SegmentIndex, index_of
from tickwheel.node.ledger.schema import SCHEMA, conformed, segments

MAX_TRACE_ROWS: Final = 10_000
"""Rows one trace answers at most (the oldest), however many retries a message had."""


@dataclass(frozen=True, slots=True)
class Trace:
    rows: list[dict[str, Any]]
    """The message's rows, by ``time_ms`` then ``node_ms``, at most ``MAX_TRACE_ROWS``."""
    segments: int
    """The closed segments searched."""
    truncated: bool
    """Whether rows were left out past ``MAX_TRACE_ROWS``."""


def trace(folder: Path, message_id: str, max_rows: int = MAX_TRACE_ROWS) -> Trace:
    """Every row of ``folder``'s closed segments about the message ``message_id``."""
    opened: list[tuple[Path, SegmentIndex]] = []
    handles: set[int] = set()
    for path in segments(folder):
        index = index_of(path)
        if index is not None:
            opened.append((path, index))
            handles |= index.handles_of(message_id)
    if not handles:
        return Trace([], len(opened), False)
    wanted = pa.array(sorted(handles), pa.int64())
    tables = []
    for path, index in opened:
        groups = index.row_groups_of(handles)
        if not groups:
            continue
        with contextlib.suppress(FileNotFoundError):  # deleted by retention meanwhile
            table = conformed(pq.ParquetFile(path).read_row_groups(sorted(groups)))
            tables.append(table.filter(pc.or_(pc.is_in(table["handle"], wanted),
                                              pc.is_in(table["new_handle"], wanted))))
    rows = pa.concat_tables(tables) if tables else SCHEMA.empty_table()
    rows = rows.sort_by([("time_ms", "ascending"), ("node_ms", "ascending")])
    return Trace(rows.slice(0, max_rows).to_pylist(), len(opened), rows.num_rows > max_rows)
