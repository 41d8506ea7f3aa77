"""The ledger's table of the rows it took (`tickwheel.node.ledger.columns`) against a model
that builds every row as a dict: the same values, in the order the chunks came, whatever mix
of events, columns given, single values (kept as runs), nulls and dead letters; and the
encodings a segment is written with (`tickwheel.node.ledger.schema.WRITE_OPTIONS`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from tickwheel.node.ledger import read_table, segments
from tickwheel.node.ledger.columns import DEAD_LETTER_PREFIX, ledger_table
from tickwheel.node.ledger.metrics import LedgerMetrics
from tickwheel.node.ledger.schema import DELTA_COLUMNS, DICTIONARY_COLUMNS, SCHEMA
from tickwheel.node.ledger.writer import Ledger, LedgerConfig
from tickwheel.replication import LedgerRows, record_columns
from tickwheel.wheel.format import encode_record

NODE = "127.0.0.1:7500"

SHAPES: dict[str, tuple[str, ...]] = {
    "scheduled": ("handle", "deliver_at_ms"),
    "leased": ("handle", "topic", "group", "lease", "deadline_ms", "possible_duplicate"),
    "acked": ("handle", "topic", "group", "lease"),
    "released": ("handle", "topic", "group", "lease"),
    "nacked": ("handle", "group", "lease", "new_handle", "deliver_at_ms"),
    "rescheduled": ("handle", "id", "topic", "old_deliver_at_ms", "new_handle",
                    "deliver_at_ms"),
    "sent": ("time_ms", "term", "epoch", "handle", "id", "topic", "group", "consumer",
             "lease", "possible_duplicate", "attempt", "deliver_at_ms", "slot_second",
             "local_index"),
    "dispatch_started": ("term", "epoch", "slot_second", "local_index"),
}
"""What each producer hands over (the replica's hooks, the courier's ``sent_rows``)."""

STRINGS = st.sampled_from(["orders", "", "%DLQ%orders", "ü-topic", "b" * 40])


def value(name: str) -> st.SearchStrategy[Any]:
    if name == "possible_duplicate":
        return st.booleans()
    if name in ("id", "topic", "group", "consumer"):
        return st.one_of(STRINGS, st.none()) if name in ("topic", "group") else STRINGS
    return st.sampled_from([0, 1, 7, -(2**63), 2**63 - 1, 1_700_000_000_123])


@st.composite
def chunk(draw: st.DrawFn) -> tuple[int, LedgerRows]:
    event = draw(st.sampled_from(sorted(SHAPES)))
    count = draw(st.integers(1, 6))
    columns: dict[str, Sequence[Any]] = {}
    for name in SHAPES[event]:
        if draw(st.booleans()):  # one value for every row, as a constant column is given
            columns[name] = [draw(value(name))] * count
        else:
            columns[name] = draw(st.lists(value(name), min_size=count, max_size=count))
    records = None
    if event == "scheduled":
        records = [encode_record(draw(STRINGS) + str(i), draw(STRINGS.filter(bool)),
                                 b"body", 5, {}, draw(st.integers(1, 3)))
                   for i in range(count)]
    if event == "nacked":
        columns["topic"] = draw(st.lists(STRINGS, min_size=count, max_size=count))
    stamp_ms = draw(st.sampled_from([1_700_000_000_000, 1_700_000_000_001]))
    return stamp_ms, LedgerRows(event, draw(value("time_ms")), columns, records)


def model(taken: list[tuple[int, LedgerRows]]) -> pa.Table:
    """Every row as a dict, in order."""
    rows = []
    for stamp_ms, chunk_rows in taken:
        columns = dict(chunk_rows.columns)
        if chunk_rows.records is not None:
            ids, topics, attempts = record_columns(chunk_rows.records)
            columns.update(id=ids, topic=topics, attempt=attempts)
        for i in range(chunk_rows.size):
            row: dict[str, Any] = {name: values[i] for name, values in columns.items()}
            row.setdefault("time_ms", chunk_rows.time_ms)
            row.update(event=chunk_rows.event, node=NODE, node_ms=stamp_ms)
            if chunk_rows.event == "nacked" and row["topic"].startswith(DEAD_LETTER_PREFIX):
                row["event"] = "dead_lettered"
            rows.append(row)
    return pa.Table.from_pylist(rows, schema=SCHEMA)


@settings(max_examples=100, deadline=None)
@given(st.lists(chunk(), min_size=1, max_size=12))
def test_the_table_holds_every_row_as_the_model_does_in_the_order_taken(
        taken: list[tuple[int, LedgerRows]]) -> None:
    table = ledger_table(taken, NODE)
    assert table.schema == SCHEMA
    assert table.to_pylist() == model(taken).to_pylist()


def test_interleaved_events_keep_their_order_and_their_single_values() -> None:
    """A burst's shape: leases, sends and acks interleaved, each with a column of one value
    (kept as a run) and one of many."""
    taken = []
    for k in range(3):
        handles = list(range(10 * k, 10 * k + 4))
        taken += [
            (100 + k, LedgerRows("leased", 50 + k, {
                "handle": handles, "topic": ["burst"] * 4, "group": [""] * 4, "lease": [1] * 4,
                "deadline_ms": [9_000] * 4, "possible_duplicate": [False] * 4})),
            (100 + k, LedgerRows("acked", 60 + k, {
                "handle": handles, "topic": [None] * 4, "group": [None] * 4,
                "lease": [1, 2, 1, 1]}))]
    table = ledger_table(taken, NODE)
    assert table.column("event").to_pylist() == ["leased"] * 4 + ["acked"] * 4 + [
        "leased"] * 4 + ["acked"] * 4 + ["leased"] * 4 + ["acked"] * 4
    assert table.column("node_ms").to_pylist() == [100] * 8 + [101] * 8 + [102] * 8
    assert table.column("time_ms").to_pylist() == [50] * 4 + [60] * 4 + [51] * 4 + [
        61] * 4 + [52] * 4 + [62] * 4
    assert table.to_pylist() == model(taken).to_pylist()


def test_a_segment_is_written_with_the_declared_encodings(tmp_path: Path) -> None:
    """Times and handles delta-encoded, only the columns of few values given a dictionary
    (an id's or a handle's overflows its page, which Parquet abandons after paying for it),
    and every row read back as it was handed over."""
    taken = [(1_700_000_000_000 + k, LedgerRows("sent", 1_700_000_000_000 + k, {
        "time_ms": [1_700_000_000_000 + k] * 100, "term": [3] * 100, "epoch": [1] * 100,
        "handle": list(range(100 * k, 100 * k + 100)),
        "id": [f"order-{i}" for i in range(100 * k, 100 * k + 100)],
        "topic": ["orders"] * 100, "group": [""] * 100, "consumer": ["c1"] * 100,
        "lease": [1] * 100, "possible_duplicate": [False] * 100, "attempt": [1] * 100,
        "deliver_at_ms": [1_700_000_000_000] * 100, "slot_second": [5] * 100,
        "local_index": list(range(100 * k, 100 * k + 100))})) for k in range(50)]
    ledger = Ledger(tmp_path, NODE, LedgerConfig(), lambda: 1_700_000_000_000,
                    LedgerMetrics(), lambda _: 1 << 40)
    ledger.start()
    for _, rows in taken:
        ledger.add(rows)
    ledger.close()
    [segment] = segments(tmp_path)
    columns = pq.ParquetFile(segment).metadata.row_group(0)
    encodings = {columns.column(i).path_in_schema: set(columns.column(i).encodings)
                 for i in range(columns.num_columns)}
    for name in DELTA_COLUMNS:
        assert "DELTA_BINARY_PACKED" in encodings[name], name
    for name in ("id", "handle", "local_index", "node_ms"):
        assert not encodings[name] & {"RLE_DICTIONARY", "PLAIN_DICTIONARY"}, name
    for name in DICTIONARY_COLUMNS:
        assert encodings[name] & {"RLE_DICTIONARY", "PLAIN_DICTIONARY"}, name
    assert read_table(tmp_path).drop_columns(["node_ms"]) == model(taken).drop_columns(
        ["node_ms"])
