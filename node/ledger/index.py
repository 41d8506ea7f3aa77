"""Each closed segment's *index*: which handles a message id names, and which row groups
hold a handle's rows, so that a trace reads a few row groups of each segment instead of
every row of the ledger.

The index of ``ledger-<node>-<sequence>.parquet`` is ``ledger-<node>-<sequence>.index.arrow``
beside it, an Arrow IPC file (uncompressed, read memory-mapped) of the schema `INDEX_SCHEMA`
with two record batches:

- batch 0, *ids*: ``(id, handle)`` for every row carrying an ``id``, once for its
  ``handle`` and once for its ``new_handle`` (a rescheduled or retried copy), distinct,
  sorted by id then handle (``row_group`` null);
- batch 1, *handles*: ``(handle, row_group)`` for every row's ``handle`` and ``new_handle``,
  distinct, sorted by handle then row group (``id`` null).

A lookup is a binary search in each batch: about 20 reads of a memory-mapped column per
segment at a million rows, whatever the segment's size. The schema's metadata names the
format's version and the SHA-256 of the segment it indexes; an index that does not match
its segment (or is missing: a segment closed before indexes existed, or whose index could
not be written) is rebuilt from the segment's ``id``, ``handle`` and ``new_handle`` columns
when a trace first needs it.

The ledger's writer builds a segment's index when it closes it, before the segment takes
its final name (`tickwheel.node.ledger.writer`); retention deletes it with its segment;
`tickwheel.node.ledger.trace` and `tickwheel.node.ledger.by_handle` read it through
`index_of`.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import threading
from pathlib import Path
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tickwheel.node.ledger.schema import read_manifest

INDEX_VERSION: Final = 1
INDEX_SUFFIX: Final = ".index.arrow"
INDEX_SCHEMA: Final = pa.schema([("id", pa.string()), ("handle", pa.int64()),
                                 ("row_group", pa.int32())])
_VERSION_KEY: Final = b"tickwheel.ledger_index.version"
_SEGMENT_KEY: Final = b"tickwheel.ledger_index.segment_sha256"


def index_path(segment: Path) -> Path:
    """The index of ``segment`` (a closed segment's path, or its ``.open`` one's)."""
    stem = segment.name.removesuffix(".open").removesuffix(".parquet")
    return segment.with_name(stem + INDEX_SUFFIX)


def segment_of_index(path: Path) -> Path:
    """The segment an index file belongs to."""
    return path.with_name(path.name.removesuffix(INDEX_SUFFIX) + ".parquet")


def write_index(segment: Path, target: Path, segment_sha256: str) -> None:
    """Build the index of the Parquet file ``segment`` and write it to ``target`` (through a
    temporary name, so a reader never sees half of one)."""
    parquet = pq.ParquetFile(segment)
    ids: list[pa.Table] = []
    handles: list[pa.Table] = []
    for group in range(parquet.num_row_groups):
        rows = parquet.read_row_group(group, columns=["id", "handle", "new_handle"])
        for column in ("handle", "new_handle"):
            named = pa.table({"id": rows["id"], "handle": rows[column]})
            ids.append(named.filter(pc.and_(pc.is_valid(named["id"]),
                                            pc.is_valid(named["handle"]))))
            handle = pc.unique(rows[column].drop_null())  # leased, sent, acked: one
            handles.append(pa.table({"handle": handle, "row_group": pa.repeat(
                pa.scalar(group, pa.int32()), len(handle))}))
    by_id = _distinct_sorted(ids, ["id", "handle"], pa.schema([("id", pa.string()),
                                                                ("handle", pa.int64())]))
    by_handle = _distinct_sorted(handles, ["handle", "row_group"], pa.schema(
        [("handle", pa.int64()), ("row_group", pa.int32())]))
    batches = [
        pa.record_batch([by_id["id"].combine_chunks(), by_id["handle"].combine_chunks(),
                         pa.nulls(by_id.num_rows, pa.int32())], schema=INDEX_SCHEMA),
        pa.record_batch([pa.nulls(by_handle.num_rows, pa.string()),
                         by_handle["handle"].combine_chunks(),
                         by_handle["row_group"].combine_chunks()], schema=INDEX_SCHEMA)]
    schema = INDEX_SCHEMA.with_metadata({_VERSION_KEY: str(INDEX_VERSION).encode(),
                                         _SEGMENT_KEY: segment_sha256.encode()})
    temporary = target.with_name(f"{target.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        with pa.OSFile(str(temporary), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
        os.replace(temporary, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def _distinct_sorted(parts: list[pa.Table], keys: list[str], schema: pa.Schema) -> pa.Table:
    """The rows of ``parts`` (none null) sorted by ``keys``, each once: sorted first, then a
    row kept where it differs from the one before (half the CPU of hashing them)."""
    table = pa.concat_tables([part.cast(schema) for part in parts]) if parts else (
        schema.empty_table())
    table = table.sort_by([(key, "ascending") for key in keys]).combine_chunks()
    if table.num_rows < 2:
        return table
    before = table.num_rows - 1
    differs = pc.not_equal(table[keys[0]].slice(1), table[keys[0]].slice(0, before))
    for key in keys[1:]:
        differs = pc.or_(differs, pc.not_equal(table[key].slice(1), table[key].slice(0, before)))
    return table.filter(pa.chunked_array([pa.array([True]), *differs.chunks]))


class SegmentIndex:
    """One segment's index, memory-mapped; `open` returns None when it is missing, of another
    version, or not of the segment whose SHA-256 is given."""

    def __init__(self, ids: pa.RecordBatch, handles: pa.RecordBatch) -> None:
        self._ids = ids.column(0)
        self._id_handles = ids.column(1)
        self._handles = handles.column(1)
        self._groups = handles.column(2)

    @classmethod
    def open(cls, path: Path, segment_sha256: str) -> SegmentIndex | None:
        try:
            reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
        except (OSError, pa.ArrowInvalid):
            return None
        metadata = reader.schema.metadata or {}
        if (metadata.get(_VERSION_KEY) != str(INDEX_VERSION).encode()
                or metadata.get(_SEGMENT_KEY) != segment_sha256.encode()
                or reader.num_record_batches != 2):
            return None
        return cls(reader.get_batch(0), reader.get_batch(1))

    def handles_of(self, message_id: str) -> set[int]:
        """Every handle a row carrying ``message_id`` names (its copies' too)."""
        found = set()
        position = bisect.bisect_left(self._ids, message_id, key=_text)
        while position < len(self._ids) and self._ids[position].as_py() == message_id:
            found.add(self._id_handles[position].as_py())
            position += 1
        return found

    def row_groups_of(self, handles: set[int]) -> set[int]:
        """The row groups holding a row whose ``handle`` or ``new_handle`` is one of these."""
        groups = set()
        for handle in handles:
            position = bisect.bisect_left(self._handles, handle, key=_number)
            while position < len(self._handles) and self._handles[position].as_py() == handle:
                groups.add(self._groups[position].as_py())
                position += 1
        return groups


def index_of(segment: Path) -> SegmentIndex | None:
    """The segment's index, built now if it has none that matches it; None if the segment
    is gone (retention deleted it since it was listed)."""
    try:
        sha256 = read_manifest(segment).sha256
        path = index_path(segment)
        index = SegmentIndex.open(path, sha256)
        if index is None:
            write_index(segment, path, sha256)
            index = SegmentIndex.open(path, sha256)
    except FileNotFoundError:
        return None
    return index


def _text(scalar: pa.Scalar) -> str:
    text: str = scalar.as_py()
    return text


def _number(scalar: pa.Scalar) -> int:
    number: int = scalar.as_py()
    return number
