"""The ledger's writer on its own (no node): segments rotated by size and by age and numbered
without a hole, rows dropped and recorded as a gap when its buffer is full or the disk is
low, torn segments found at start (a real kill: test_ledger_kill.py), retention by age and
by bytes, and every segment read back with pyarrow against its manifest."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tickwheel.harness.local_cluster import wait_for
from tickwheel.node.ledger import read_manifest, read_table, segments
from tickwheel.node.ledger.index import index_path
from tickwheel.node.ledger.metrics import LedgerMetrics
from tickwheel.node.ledger.read import missing_sequences
from tickwheel.node.ledger.schema import SCHEMA, Gap, segment_name, sequence_of
from tickwheel.node.ledger.writer import Ledger, LedgerConfig
from tickwheel.replication import LedgerRows
from tickwheel.wheel.format import encode_record

NODE = "127.0.0.1:7500"
ROOMY = 1 << 40


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now_ms


def scheduled(first: int, count: int) -> LedgerRows:
    records = [encode_record(f"m{i}", "orders", b"x" * 64, 5_000 + i, {}, 1)
               for i in range(first, first + count)]
    return LedgerRows("scheduled", 900, {"handle": list(range(first, first + count)),
                                         "deliver_at_ms": [5_000 + i for i in
                                                           range(first, first + count)]},
                      records)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def metrics() -> LedgerMetrics:
    return LedgerMetrics()


def open_ledger(folder: Path, clock: Clock, metrics: LedgerMetrics, free: int = ROOMY,
                **config: int) -> Ledger:
    return Ledger(folder, NODE, LedgerConfig(**config), clock, metrics, lambda _: free)


@pytest.fixture
def ledger(tmp_path: Path, clock: Clock, metrics: LedgerMetrics) -> Iterator[Ledger]:
    opened = open_ledger(tmp_path, clock, metrics, max_segment_bytes=4_096)
    opened.start()
    yield opened
    opened.close()


def test_segments_rotate_by_size_numbered_in_order_and_read_back_whole(
        ledger: Ledger, tmp_path: Path) -> None:
    for start in range(0, 3_000, 100):
        ledger.add(scheduled(start, 100))
        ledger.rotate() if start % 500 == 400 else None
    ledger.close()
    paths = segments(tmp_path)
    assert len(paths) > 3
    assert [sequence_of(path) for path in paths] == list(range(1, len(paths) + 1))
    assert all(path.name == segment_name(NODE, i + 1) for i, path in enumerate(paths))
    table = read_table(tmp_path)  # every segment's SHA-256 against its manifest
    assert table.schema.equals(SCHEMA)
    assert table.column("id").to_pylist() == [f"m{i}" for i in range(3_000)]
    assert set(table.column("event").to_pylist()) == {"scheduled"}
    manifests = [read_manifest(path) for path in paths]
    assert sum(m.rows for m in manifests) == 3_000
    footer = pq.read_metadata(paths[1]).metadata
    assert footer[b"tickwheel.ledger.sequence"] == b"2"
    assert footer[b"tickwheel.ledger.rows"] == str(manifests[1].rows).encode()
    assert pq.read_metadata(paths[0]).row_group(0).column(0).compression == "ZSTD"


def test_a_segment_closes_at_its_age(tmp_path: Path, clock: Clock,
                                     metrics: LedgerMetrics) -> None:
    ledger = open_ledger(tmp_path, clock, metrics, max_segment_age_ms=60_000, flush_ms=5)
    ledger.start()
    try:
        ledger.add(scheduled(0, 10))
        wait_for(lambda: metrics.rows._value.get() == 10, 5, "the rows written")
        assert segments(tmp_path) == []  # open, and young
        clock.now_ms += 60_000
        wait_for(lambda: segments(tmp_path), 5, "the segment closed at its age")
    finally:
        ledger.close()
    assert read_manifest(segments(tmp_path)[0]).rows == 10


def test_a_manifest_says_until_when_the_node_recorded_everything(
        tmp_path: Path, clock: Clock, metrics: LedgerMetrics) -> None:
    """``complete_ms``: the audit judges a node's sends up to it (rows after it are in the
    open segment, not fetched); idle time after the last row counts as recorded."""
    ledger = open_ledger(tmp_path, clock, metrics, max_segment_age_ms=60_000, flush_ms=5)
    started_ms = clock.now_ms
    ledger.start()
    try:
        ledger.add(scheduled(0, 10))
        wait_for(lambda: metrics.rows._value.get() == 10, 5, "the first rows written")
        clock.now_ms += 30_000
        ledger.add(scheduled(10, 10))
        wait_for(lambda: metrics.rows._value.get() == 20, 5, "the rows written")
        clock.now_ms += 30_000
        wait_for(lambda: segments(tmp_path), 5, "the segment closed at its age")
        ledger.add(scheduled(20, 5))
    finally:
        clock.now_ms += 1_000
        ledger.close()
    first, second = (read_manifest(path) for path in segments(tmp_path))
    assert (first.first_ms, first.last_ms) == (started_ms, started_ms + 30_000)
    assert first.complete_ms == started_ms + 60_000
    assert (second.last_ms, second.complete_ms) == (started_ms + 60_000, started_ms + 61_000)


def test_a_full_buffer_drops_rows_without_waiting_and_the_next_segment_records_the_gap(
        tmp_path: Path, clock: Clock, metrics: LedgerMetrics) -> None:
    ledger = open_ledger(tmp_path, clock, metrics, max_buffer_rows=100)
    ledger.add(scheduled(0, 80))  # the writer is not started: nothing drains the buffer
    ledger.add(scheduled(80, 30))  # dropped: 110 rows would not fit
    clock.now_ms += 5
    ledger.add(scheduled(110, 10))
    ledger.add(scheduled(120, 20))  # dropped
    ledger.start()
    ledger.close()
    (path,) = segments(tmp_path)
    manifest = read_manifest(path)
    assert manifest.rows == 80 + 10
    assert read_table(path).column("handle").to_pylist() == [*range(80), *range(110, 120)]
    assert manifest.gaps == [Gap("buffer_full", 50, clock.now_ms - 5, clock.now_ms)]
    footer = pq.read_metadata(path).metadata
    assert json.loads(footer[b"tickwheel.ledger.gaps"]) == [
        {"reason": "buffer_full", "rows": 50, "first_ms": clock.now_ms - 5,
         "last_ms": clock.now_ms, "sequence": None}]
    assert metrics.dropped.labels("buffer_full")._value.get() == 50


def test_gaps_left_at_close_get_an_empty_segment_of_their_own(
        tmp_path: Path, clock: Clock, metrics: LedgerMetrics) -> None:
    ledger = open_ledger(tmp_path, clock, metrics, max_buffer_rows=10)
    ledger.start()
    ledger.rotate()
    ledger.add(scheduled(0, 11))
    ledger.close()
    (path,) = segments(tmp_path)
    assert read_manifest(path).rows == 0
    assert read_manifest(path).gaps[0].rows == 11


def test_a_segment_torn_by_a_crash_is_deleted_and_recorded_and_numbers_go_on(
        tmp_path: Path, clock: Clock, metrics: LedgerMetrics) -> None:
    first = open_ledger(tmp_path, clock, metrics)
    first.start()
    first.add(scheduled(0, 5))
    first.close()
    torn = tmp_path / (segment_name(NODE, 2) + ".open")
    torn.write_bytes(b"PAR1 half a row group")
    second = open_ledger(tmp_path, clock, metrics)
    assert not torn.exists()
    second.start()
    second.add(scheduled(5, 5))
    second.close()
    paths = segments(tmp_path)
    assert [sequence_of(path) for path in paths] == [1, 3, 4]  # 3: the gap, closed at start
    assert missing_sequences(tmp_path) == [2]
    last_ms = read_manifest(paths[0]).last_ms
    assert read_manifest(paths[1]).gaps == [Gap("torn_segment", None, last_ms, clock.now_ms, 2)]
    assert read_manifest(paths[1]).rows == 0


def test_a_disk_below_the_reserve_gets_no_segment_and_the_rows_are_a_gap(
        tmp_path: Path, clock: Clock, metrics: LedgerMetrics) -> None:
    free = [10 << 20]
    ledger = Ledger(tmp_path, NODE, LedgerConfig(reserve_bytes=8 << 20,
                                                 max_segment_bytes=4 << 20),
                    clock, metrics, lambda _: free[0])
    ledger.start()
    ledger.add(scheduled(0, 7))
    ledger.rotate()
    assert segments(tmp_path) == []
    assert metrics.dropped.labels("disk_low")._value.get() == 7
    free[0] = 1 << 30
    ledger.add(scheduled(7, 3))
    ledger.close()
    (path,) = segments(tmp_path)
    assert read_manifest(path).rows == 3
    assert [(gap.reason, gap.rows) for gap in read_manifest(path).gaps] == [("disk_low", 7)]


def test_a_low_disk_deletes_no_segment(tmp_path: Path, clock: Clock,
                                       metrics: LedgerMetrics) -> None:
    """The ledger stops writing while the disk is low; the evidence it holds stays (a chaos
    run's disk-full fault deleted a leader's earlier terms when it made room)."""
    free = [1 << 30]
    ledger = Ledger(tmp_path, NODE, LedgerConfig(reserve_bytes=8 << 20,
                                                 max_segment_bytes=4 << 20),
                    clock, metrics, lambda _: free[0])
    ledger.start()
    for start in range(0, 30, 10):
        ledger.add(scheduled(start, 10))
        ledger.rotate()
    free[0] = 1 << 20
    ledger.add(scheduled(30, 10))
    ledger.rotate()
    ledger.close()
    assert [sequence_of(path) for path in segments(tmp_path)] == [1, 2, 3]
    assert metrics.dropped.labels("disk_low")._value.get() == 10


def test_retention_deletes_the_oldest_segments_by_age_and_keeps_the_newest(
        tmp_path: Path, clock: Clock, metrics: LedgerMetrics) -> None:
    ledger = open_ledger(tmp_path, clock, metrics, max_age_s=3_600)
    ledger.start()
    for start in range(0, 40, 10):
        ledger.add(scheduled(start, 10))
        ledger.rotate()
    old_s = clock.now_ms / 1000 - 7_200
    for path in segments(tmp_path)[:3]:
        os.utime(path, (old_s, old_s))
    ledger.add(scheduled(40, 10))
    ledger.close()
    assert [sequence_of(path) for path in segments(tmp_path)] == [4, 5]
    assert metrics.deleted.labels("age")._value.get() == 3
    assert not (tmp_path / segment_name(NODE, 1)).with_suffix(".json").exists()


def test_retention_keeps_the_segments_within_max_bytes(
        tmp_path: Path, clock: Clock, metrics: LedgerMetrics) -> None:
    ledger = open_ledger(tmp_path, clock, metrics, max_bytes=20_000)
    ledger.start()
    for start in range(0, 200, 10):
        ledger.add(scheduled(start, 10))
        ledger.rotate()
    ledger.close()
    paths = segments(tmp_path)
    kept_bytes = sum(path.stat().st_size + index_path(path).stat().st_size for path in paths)
    assert kept_bytes <= 20_000 and len(paths) >= 2
    assert sequence_of(paths[-1]) == 21  # the stop's, empty: until when all was written
    assert metrics.deleted.labels("bytes")._value.get() == 21 - len(paths)
    assert metrics.bytes._value.get() == kept_bytes


def test_a_segment_whose_bytes_changed_is_refused(ledger: Ledger, tmp_path: Path) -> None:
    ledger.add(scheduled(0, 10))
    ledger.rotate()
    (path,) = segments(tmp_path)
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="SHA-256"):
        read_table(tmp_path)
