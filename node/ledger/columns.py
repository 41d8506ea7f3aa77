"""The ledger's rows, from the columns its producers hand over to one Arrow table in the order
they were handed over: the part of writing a segment that holds the GIL.

The Raft thread and the courier hand over `LedgerRows` of a few hundred rows each, columns of
Python objects. Turning a Python object into an Arrow value is the cost that competes with
them (~22 ns an integer, ~30 a string, under the GIL), so this module walks each object once
and no other:

- the chunks are gathered by *shape* (the columns given, and whether the event is ``nacked``),
  so a column is a Python list only where its chunks gave values, never padded with ``None``:
  the columns a shape lacks are `pyarrow.nulls`;
- a chunk whose column holds one value (``term``, ``group``, ``lease`` 1, ...) and the values
  the ledger adds (``event``, ``node_ms``, a committed event's ``time_ms``) are kept as runs
  and built by Arrow (`pyarrow.repeat`, an ``int64`` buffer), not walked;
- one ``pa.array`` per listed column and shape, then one ``take`` (in Arrow, without the GIL)
  puts the rows back in the order they came: each chunk's rows stay together, and a reader
  sees a segment's rows in the order the node handed them over.

A wheel record's ``id``, ``topic`` and ``attempt`` are read here (`record_columns`), on the
ledger's thread. Called by `tickwheel.node.ledger.writer` on its thread, once a write.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from tickwheel.node.ledger.schema import COLUMNS, SCHEMA
from tickwheel.replication import LedgerRows, record_columns

DEAD_LETTER_PREFIX: Final = "%DLQ%"
"""A retry copy filed in a topic named so is ``dead_lettered``, not ``nacked``
(`tickwheel.node.delivery.levels`)."""
_KINDS: Final = {name: kind for name, kind, _ in COLUMNS}
_ADDED: Final = frozenset({"event", "node", "node_ms"})
"""Columns the ledger fills itself (a producer's are ignored)."""
_INT64: Final = pa.int64()


class _Column:
    """One column of a shape's rows: runs of ``(value, rows)`` while every chunk held a single
    value, else (from the first chunk that did not) a list of every row's value."""

    __slots__ = ("runs", "values")

    def __init__(self) -> None:
        self.runs: list[tuple[Any, int]] = []
        self.values: list[Any] | None = None

    def add(self, given: Sequence[Any], count: int) -> None:
        values = self.values
        if values is None:
            first = given[0] if given else None
            if not given or (given[-1] == first and given.count(first) == count):
                self.repeat(first, count)
                return
            self.values = values = []
            for value, rows in self.runs:
                values.extend([value] * rows)
            self.runs = []
        values.extend(given)

    def repeat(self, value: Any, count: int) -> None:
        if self.values is not None:
            self.values.extend([value] * count)
        elif self.runs and self.runs[-1][0] == value:
            self.runs[-1] = (value, self.runs[-1][1] + count)
        else:
            self.runs.append((value, count))

    def array(self, kind: pa.DataType) -> pa.Array:
        if self.values is not None:
            return pa.array(self.values, kind)
        if kind == _INT64 and len(self.runs) > 1 and all(value is not None
                                                         for value, _ in self.runs):
            buffer = array("q")
            for value, rows in self.runs:
                buffer.extend(array("q", (value,)) * rows)
            return _int64(buffer)
        parts = [pa.repeat(pa.scalar(value, kind), rows) for value, rows in self.runs]
        return parts[0] if len(parts) == 1 else pa.concat_arrays(parts)


class _Shape:
    """Every row taken whose chunk gave these columns (and was ``nacked`` or not)."""

    __slots__ = ("columns", "event", "node_ms", "size")

    def __init__(self, names: tuple[str, ...]) -> None:
        self.columns = {name: _Column() for name in names}
        if "time_ms" not in names:
            self.columns["time_ms"] = _Column()
        self.event = _Column()
        self.node_ms = _Column()
        self.size = 0

    def add(self, stamp_ms: int, rows: LedgerRows, columns: dict[str, Sequence[Any]],
            count: int) -> None:
        for name, column in self.columns.items():
            given = columns.get(name)
            if given is None:  # time_ms: the rows' own
                column.repeat(rows.time_ms, count)
            else:
                column.add(given, count)
        if rows.event == "nacked":
            self.event.add(["dead_lettered" if topic.startswith(DEAD_LETTER_PREFIX)
                            else "nacked" for topic in columns["topic"]], count)
        else:
            self.event.repeat(rows.event, count)
        self.node_ms.repeat(stamp_ms, count)
        self.size += count

    def batch(self, node: str) -> pa.RecordBatch:
        arrays = []
        for name, kind, _ in COLUMNS:
            column = (self.event if name == "event" else self.node_ms if name == "node_ms"
                      else self.columns.get(name))
            if name == "node":
                arrays.append(pa.repeat(pa.scalar(node, kind), self.size))
            elif column is None:
                arrays.append(pa.nulls(self.size, kind))
            else:
                arrays.append(column.array(kind))
        return pa.record_batch(arrays, schema=SCHEMA)


def ledger_table(taken: list[tuple[int, LedgerRows]], node: str) -> pa.Table:
    """One table (`SCHEMA`) of every row ``taken`` (each chunk with its ``node_ms``), in the
    order taken."""
    shapes: dict[tuple[bool, tuple[str, ...]], _Shape] = {}
    chunks: list[tuple[_Shape, int, int]] = []
    for stamp_ms, rows in taken:
        columns = dict(rows.columns)
        if rows.records is not None:
            ids, topics, attempts = record_columns(rows.records)
            columns.update(id=ids, topic=topics, attempt=attempts)
        names = tuple(name for name in columns if name in _KINDS and name not in _ADDED)
        key = (rows.event == "nacked", names)
        shape = shapes.get(key)
        if shape is None:
            shape = shapes[key] = _Shape(names)
        count = rows.size
        chunks.append((shape, shape.size, count))
        shape.add(stamp_ms, rows, columns, count)
    grouped = pa.Table.from_batches([shape.batch(node) for shape in shapes.values()],
                                    schema=SCHEMA)
    if len(shapes) == 1:
        return grouped
    return grouped.take(_arrival_order(list(shapes.values()), chunks))


def _arrival_order(shapes: list[_Shape], chunks: list[tuple[_Shape, int, int]]) -> pa.Array:
    """The row of the grouped table (the shapes' rows one shape after another) that each row
    taken became: a chunk's rows are consecutive in both, so row ``i`` of chunk ``k`` is
    ``i + shift[k]``, built by Arrow from one shift a chunk."""
    first: dict[int, int] = {}
    at = 0
    for shape in shapes:
        first[id(shape)] = at
        at += shape.size
    ends, shifts = array("q"), array("q")
    position = 0
    for shape, start, count in chunks:
        shifts.append(first[id(shape)] + start - position)
        position += count
        ends.append(position)
    shift = pc.run_end_decode(pa.RunEndEncodedArray.from_arrays(_int64(ends), _int64(shifts)))
    ones = pa.repeat(pa.scalar(1, _INT64), position)
    return pc.add(pc.subtract(pc.cumulative_sum(ones), 1), shift)


def _int64(values: array[int]) -> pa.Array:
    """An Arrow ``int64`` array over the buffer of ``values`` (no copy, no object walked)."""
    return pa.Array.from_buffers(_INT64, len(values), [None, pa.py_buffer(values)])
