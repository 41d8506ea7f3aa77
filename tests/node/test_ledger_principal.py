"""The ledger's ``principal`` column (format 2) without a node: the writer stores who asked on
the rows that name one and null on the others, and a segment of format 1, written before the
column, is read by `read_table` and by a trace with ``principal`` null. The Spark audit's
reading of such a segment: tests/audit/test_old_segments.py."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tickwheel.node.ledger import read_manifest, read_table, segments
from tickwheel.node.ledger.schema import ADDED, FORMAT_VERSION, SCHEMA, Manifest, segment_name
from tickwheel.node.ledger.trace import trace
from tickwheel.node.ledger.writer import Ledger, LedgerConfig
from tickwheel.replication import LedgerRows
from tickwheel.wheel.format import encode_record

NODE = "127.0.0.1:7500"
NOW_MS = 1_700_000_000_000


def write_segments(folder: Path, *batches: LedgerRows) -> None:
    ledger = Ledger(folder, NODE, LedgerConfig(), lambda: NOW_MS, measure_free=lambda _: 1 << 40)
    ledger.start()
    for rows in batches:
        ledger.add(rows)
    ledger.close()


def old_segment(folder: Path, sequence: int, rows: list[dict[str, object]]) -> Path:
    """A closed segment of format 1: the schema without the columns added since, and its
    manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    first = pa.schema([field for field in SCHEMA if field.name not in ADDED])
    path = folder / segment_name(NODE, sequence)
    pq.write_table(pa.Table.from_pylist(rows, schema=first), path, compression="zstd")
    data = path.read_bytes()
    times = [int(str(row["node_ms"])) for row in rows]
    manifest = Manifest(1, NODE, sequence, len(rows), min(times), max(times), min(times),
                        max(times), bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    path.with_suffix(".json").write_text(manifest.to_json())
    return path


def row(event: str, handle: int, **more: object) -> dict[str, object]:
    return {"event": event, "node": NODE, "node_ms": NOW_MS - 1_000, "time_ms": NOW_MS - 1_000,
            "handle": handle, **more}


def test_the_writer_stores_who_asked_and_null_where_no_one_is_named(tmp_path: Path) -> None:
    records = [encode_record(f"m{i}", "orders", b"x", 5_000, {}, 1) for i in range(3)]
    write_segments(tmp_path, LedgerRows("scheduled", 900, {
        "handle": [1, 2, 3], "deliver_at_ms": [5_000] * 3,
        "principal": ["orders-service", "orders-service", ""]}, records),
        LedgerRows("cancelled", 901, {"handle": [2], "id": ["m1"], "topic": ["orders"],
                                      "deliver_at_ms": [5_000], "principal": ["auditor"]}),
        LedgerRows("acked", 902, {"handle": [1], "group": [""], "lease": [1]}))
    (segment,) = segments(tmp_path)
    assert read_manifest(segment).version == FORMAT_VERSION == 2
    rows = read_table(tmp_path).to_pylist()
    assert [(r["event"], r["handle"], r["principal"]) for r in rows] == [
        ("scheduled", 1, "orders-service"), ("scheduled", 2, "orders-service"),
        ("scheduled", 3, ""), ("cancelled", 2, "auditor"), ("acked", 1, None)]


def test_a_segment_written_before_the_column_reads_it_as_null(tmp_path: Path) -> None:
    old_segment(tmp_path, 1, [row("scheduled", 7, id="old-1", topic="orders",
                                  deliver_at_ms=NOW_MS, attempt=1),
                              row("cancelled", 7, id="old-1", topic="orders",
                                  deliver_at_ms=NOW_MS)])
    records = [encode_record("new-1", "orders", b"x", NOW_MS, {}, 1)]
    write_segments(tmp_path, LedgerRows("scheduled", NOW_MS, {
        "handle": [8], "deliver_at_ms": [NOW_MS], "principal": ["orders-service"]}, records))
    assert [read_manifest(path).version for path in segments(tmp_path)] == [1, 2]
    table = read_table(tmp_path)
    assert table.schema == SCHEMA
    assert [(r["handle"], r["principal"]) for r in table.to_pylist()] == [
        (7, None), (7, None), (8, "orders-service")]
    found = trace(tmp_path, "old-1")
    assert [(r["event"], r["principal"]) for r in found.rows] == [
        ("scheduled", None), ("cancelled", None)]
    assert [r["principal"] for r in trace(tmp_path, "new-1").rows] == ["orders-service"]
