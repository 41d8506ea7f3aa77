"""The audit reads ledgers of both formats: a segment of format 1, written before the
``principal`` column, beside one of format 2 (each node's own). Its rows read ``principal``
as null, the newer ones as written, and the summary counts what each principal asked for
per topic and hour (``principals``), without Spark failing on the column one file lacks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from sparktests import spark_session
from test_ledger_principal import NOW_MS, old_segment, row, write_segments

from tickwheel.audit import AuditOptions, audit_ledgers
from tickwheel.audit.layout import fetched_segments, read_ledger
from tickwheel.replication import LedgerRows
from tickwheel.wheel.format import encode_record

pytestmark = pytest.mark.cluster  # a JVM


@pytest.fixture(scope="module")
def spark(in_background: Callable[..., Any]) -> Iterator[SparkSession]:
    yield from spark_session(in_background)


def test_a_segment_without_the_column_reads_as_null_and_the_summary_counts_principals(
        spark: SparkSession, tmp_path: Path) -> None:
    node = tmp_path / "shard-0" / "node0"
    old_segment(node, 1, [row("scheduled", 7, id="old-1", topic="orders",
                              deliver_at_ms=NOW_MS + 3_600_000, attempt=1)])
    records = [encode_record(f"new-{i}", "orders", b"x", NOW_MS + 3_600_000, {}, 1)
               for i in range(3)]
    write_segments(node, LedgerRows("scheduled", NOW_MS, {
        "handle": [8, 9, 10], "deliver_at_ms": [NOW_MS + 3_600_000] * 3,
        "principal": ["orders-service", "orders-service", ""]}, records),
        LedgerRows("cancelled", NOW_MS + 1, {
            "handle": [9], "id": ["new-1"], "topic": ["orders"],
            "deliver_at_ms": [NOW_MS + 3_600_000], "principal": ["auditor"]}))
    rows = read_ledger(spark, fetched_segments(tmp_path)).select(
        "handle", "event", "principal").collect()
    assert sorted((r.handle, r.event, r.principal) for r in rows) == [
        (7, "scheduled", None), (8, "scheduled", "orders-service"),
        (9, "cancelled", "auditor"), (9, "scheduled", "orders-service"), (10, "scheduled", "")]
    summary = audit_ledgers(spark, tmp_path, AuditOptions(until_ms=NOW_MS + 10))
    assert summary["shards"]["0"]["messages"]["scheduled"] == 4
    assert [(r["principal"], r["topic"], r["scheduled"], r["cancelled"])
            for r in summary["principals"]] == [
        (None, "orders", 1, 0), ("", "orders", 1, 0), ("auditor", "orders", 0, 1),
        ("orders-service", "orders", 2, 0)]
