"""Reading a ledger back with pyarrow: the closed segments of a folder as one table, each
checked against its manifest (its SHA-256) and its pages' checksums, and the gaps between
them found by sequence number.

For the harness and the tests (`tickwheel.harness.local_cluster` reads a node's sends from
here); the chaos audit reads the same files with Spark (`tickwheel.chaos.run_logs`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq

from tickwheel.node.ledger.schema import SCHEMA, read_manifest, segments, sequence_of

LEDGER_FOLDER: Final = "ledger"
"""The ledger's folder in a node's data folder."""


def read_table(where: Path, verify: bool = True) -> pa.Table:
    """Every row of the closed segments in the folder ``where`` (oldest segment first), or of
    the one segment ``where``. ``verify``: raise `ValueError` if a segment's bytes do not
    match its manifest's SHA-256. Every page's checksum is checked."""
    tables = []
    for path in segments(where) if where.is_dir() else [where]:
        if verify:
            manifest = read_manifest(path)
            if hashlib.sha256(path.read_bytes()).hexdigest() != manifest.sha256:
                raise ValueError(f"{path}: its bytes do not match its manifest's SHA-256")
        tables.append(pq.read_table(path, schema=SCHEMA, page_checksum_verification=True))
    return pa.concat_tables(tables) if tables else SCHEMA.empty_table()


def read_rows(where: Path) -> list[dict[str, Any]]:
    """`read_table` as a dict per row (for tests and small ledgers)."""
    rows: list[dict[str, Any]] = read_table(where, verify=False).to_pylist()
    return rows


def missing_sequences(folder: Path) -> list[int]:
    """Sequence numbers between the oldest and the newest closed segment that no closed
    segment has (each should be named by a ``torn_segment`` gap, or deleted by hand)."""
    numbers = [sequence_of(path) or 0 for path in segments(folder)]
    if not numbers:
        return []
    return sorted(set(range(numbers[0], numbers[-1] + 1)) - set(numbers))
