"""``python -m tickwheel.harness.ledger_writer_bench --json``: the ledger's writer's CPU per
row, on its own (no node), and what keeping a killed node's unclosed rows would add to it.

A `Ledger` (its real thread, a temporary folder, the node's default settings but the flush)
is handed ``--rows`` rows the way a leader hands them: batches of ``--batch`` rows, a third
each ``leased``, ``sent`` and ``acked``, added from this thread as fast as it can, then
closed. ``writer_us_per_row`` is the process's CPU time (every thread's) from the first
``add`` to the end of ``close``, per row: the columns joined into Arrow, the Parquet row
groups, the segments closed with their manifests and indexes. ``journal_us_per_row`` is
the CPU of writing the same row groups once more, as an Arrow IPC stream, the cheapest
file a killed node's open segment could be read back from, in batches of
``--journal-rows`` (a second's flush: 65,536 at most; what keeping those rows would add at
the least, since the rows still buffered when it dies would need a write on the Raft thread
and the event loop besides); ``journal_bytes_per_row`` is its size, beside the segments'
``segment_bytes_per_row``. Medians of ``--rounds``. Run it under
``flock /tmp/tickwheel-measure.lock``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import ipc

from tickwheel.node import LEDGER_SCHEMA, Ledger, LedgerConfig, ledger_segments
from tickwheel.replication import LedgerRows

NODE = "127.0.0.1:7500"


def batch(event: str, first: int, count: int, now_ms: int) -> LedgerRows:
    """``count`` rows of one event, with the columns a leader fills for it."""
    handles = list(range(first, first + count))
    common: dict[str, Sequence[Any]] = {
        "handle": handles, "group": ["billing"] * count, "lease": [1] * count,
        "topic": ["orders"] * count}
    if event == "sent":
        common |= {"id": [f"m-{h}" for h in handles], "term": [2] * count,
                   "epoch": [1] * count, "consumer": ["billing-1"] * count,
                   "possible_duplicate": [False] * count, "attempt": [1] * count,
                   "deliver_at_ms": [now_ms] * count, "slot_second": [now_ms // 1000] * count,
                   "local_index": handles}
    elif event == "leased":
        common |= {"possible_duplicate": [False] * count, "deadline_ms": [now_ms] * count}
    return LedgerRows(event, now_ms, common)


def one_round(folder: Path, rows: int, size: int, journal_rows: int) -> dict[str, float]:
    now_ms = int(time.time() * 1000)
    batches = [batch(("leased", "sent", "acked")[n % 3], n * size, size, now_ms)
               for n in range(rows // size)]
    ledger = Ledger(folder, NODE, LedgerConfig(flush_ms=50), lambda: int(time.time() * 1000))
    ledger.start()
    began = time.process_time()
    for rows_ in batches:
        ledger.add(rows_)
    ledger.close()
    writer_s = time.process_time() - began
    written = pa.concat_tables(pq.read_table(path, schema=LEDGER_SCHEMA)
                               for path in ledger_segments(folder))
    groups = written.combine_chunks().to_batches(max_chunksize=journal_rows)
    began = time.process_time()
    with pa.OSFile(str(folder / "journal.arrows"), "wb") as sink, \
            ipc.new_stream(sink, LEDGER_SCHEMA) as stream:
        for group in groups:
            stream.write_batch(group)
    journal_s = time.process_time() - began
    count = written.num_rows
    return {"rows": count, "writer_us_per_row": writer_s / count * 1e6,
            "journal_us_per_row": journal_s / count * 1e6,
            "journal_bytes_per_row": (folder / "journal.arrows").stat().st_size / count,
            "segment_bytes_per_row": sum(path.stat().st_size
                                         for path in ledger_segments(folder)) / count}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rows", type=int, default=600_000)
    parser.add_argument("--batch", type=int, default=200, help="rows an add hands over")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--journal-rows", type=int, default=65_536,
                        help="rows a batch of the journal measured beside")
    args = parser.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="tickwheel-ledger-writer-bench-") as root:
        for round_ in range(args.rounds):
            runs.append(one_round(Path(root) / str(round_), args.rows, args.batch,
                                  args.journal_rows))
    result: dict[str, Any] = {"rows": args.rows, "batch": args.batch, "rounds": args.rounds,
                              "journal_rows": args.journal_rows}
    for key in ("writer_us_per_row", "journal_us_per_row", "journal_bytes_per_row",
                "segment_bytes_per_row"):
        result[key] = round(statistics.median(run[key] for run in runs), 3)
        result[f"{key}_each"] = [round(run[key], 3) for run in runs]
    print(json.dumps(result, indent=2) if args.json else result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
