"""Each closed segment's index and the trace it serves (no node): a message's rows across
segments, its copies' rows by handle, an index written at close and deleted with its
segment, one rebuilt when missing or not of its segment, and an unknown id finding
nothing."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_ledger import NODE, ROOMY, Clock, scheduled

from tickwheel.node.ledger import segments
from tickwheel.node.ledger.index import SegmentIndex, index_path
from tickwheel.node.ledger.metrics import LedgerMetrics
from tickwheel.node.ledger.schema import read_manifest
from tickwheel.node.ledger.trace import trace
from tickwheel.node.ledger.writer import Ledger, LedgerConfig
from tickwheel.replication import LedgerRows


def lifecycle(ledger: Ledger) -> None:
    """m0..m199 scheduled with handles 0..199; m7 leased, nacked (its copy 1007), the copy
    leased and acked, each in a segment of its own."""
    ledger.add(scheduled(0, 200))
    ledger.rotate()
    ledger.add(LedgerRows("leased", 1_000, {"handle": [7, 8], "group": ["", ""],
                                             "lease": [1, 1], "topic": ["orders"] * 2}))
    ledger.rotate()
    ledger.add(LedgerRows("nacked", 2_000, {"handle": [7], "new_handle": [1_007],
                                             "id": ["m7"], "topic": ["orders"],
                                             "group": [""], "lease": [1], "attempt": [2]}))
    ledger.add(LedgerRows("leased", 3_000, {"handle": [1_007], "group": [""], "lease": [1],
                                             "topic": ["orders"]}))
    ledger.rotate()
    ledger.add(LedgerRows("acked", 4_000, {"handle": [1_007], "group": [""], "lease": [1],
                                            "topic": ["orders"]}))
    ledger.add(LedgerRows("acked", 4_000, {"handle": [8], "group": [""], "lease": [1],
                                            "topic": ["orders"]}))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    ledger = Ledger(tmp_path, NODE, LedgerConfig(), Clock(), LedgerMetrics(), lambda _: ROOMY)
    ledger.start()
    lifecycle(ledger)
    ledger.close()
    return tmp_path


def test_a_trace_finds_every_row_of_a_message_and_of_its_copy(folder: Path) -> None:
    found = trace(folder, "m7")
    assert found.segments == 4 and not found.truncated
    assert [(row["event"], row["handle"], row["new_handle"]) for row in found.rows] == [
        ("scheduled", 7, None), ("leased", 7, None), ("nacked", 7, 1_007),
        ("leased", 1_007, None), ("acked", 1_007, None)]


def test_an_unknown_id_finds_nothing(folder: Path) -> None:
    assert trace(folder, "m7x").rows == [] and trace(folder, "m").rows == []


def test_every_closed_segment_has_its_index_naming_only_its_row_groups(folder: Path) -> None:
    for path in segments(folder):
        index = SegmentIndex.open(index_path(path), read_manifest(path).sha256)
        assert index is not None
        groups = index.row_groups_of({7, 8, 1_007})
        assert groups <= set(range(pq.ParquetFile(path).num_row_groups))
    first = SegmentIndex.open(index_path(segments(folder)[0]),
                              read_manifest(segments(folder)[0]).sha256)
    assert first is not None and first.handles_of("m7") == {7} and first.row_groups_of({7})


def test_a_missing_or_foreign_index_is_rebuilt(folder: Path) -> None:
    first, second = segments(folder)[:2]
    index_path(first).unlink()
    index_path(second).write_bytes(index_path(segments(folder)[2]).read_bytes())
    assert SegmentIndex.open(index_path(second), read_manifest(second).sha256) is None
    assert [row["event"] for row in trace(folder, "m7").rows] == [
        "scheduled", "leased", "nacked", "leased", "acked"]
    assert SegmentIndex.open(index_path(first), read_manifest(first).sha256) is not None
    assert SegmentIndex.open(index_path(second), read_manifest(second).sha256) is not None


def test_retention_deletes_an_index_with_its_segment(tmp_path: Path) -> None:
    clock = Clock()
    ledger = Ledger(tmp_path, NODE, LedgerConfig(max_bytes=1), clock, LedgerMetrics(),
                    lambda _: ROOMY)
    ledger.start()
    for start in range(0, 300, 100):
        ledger.add(scheduled(start, 100))
        ledger.rotate()
    ledger.close()
    (kept,) = segments(tmp_path)
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        [kept.name, kept.with_suffix(".json").name, index_path(kept).name])


def test_retention_counts_the_indexes_bytes(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path, NODE, LedgerConfig(), Clock(), LedgerMetrics(), lambda _: ROOMY)
    ledger.start()
    for start in range(0, 300, 100):
        ledger.add(scheduled(start, 100))
        ledger.rotate()
    ledger.close()
    kept = segments(tmp_path)
    both = sum(path.stat().st_size + index_path(path).stat().st_size for path in kept)
    reopened = Ledger(tmp_path, NODE, LedgerConfig(max_bytes=both - 1), Clock(),
                      LedgerMetrics(), lambda _: ROOMY)
    reopened.close()
    assert segments(tmp_path)[0] != kept[0] and not index_path(kept[0]).exists()
