"""``python -m tickwheel.harness.trace_bench --json``: how long ``tickwheel trace`` takes on a
running cluster whose every node holds a ledger of about a million rows.

Before the 3 nodes start, each one's ledger is written by the node's own writer (`Ledger`, so
each segment gets its index as it closes): ``--messages`` messages (250,000: a million rows),
each ``scheduled``, ``leased``, ``sent`` (by the first node) and ``acked`` in three successive
blocks of ``--block`` messages (a block's rows reach the writer together, so a message's rows
lie in three row groups of up to 65,536 rows, as at a few thousand messages a second), a
segment closed every ``--segment-rows`` rows. Then the client library's `LedgerClient.trace`
(what the command runs: ``ClusterInfo`` once, then ``TraceMessage`` on every node at once,
merged) traces ``--traces`` ids picked at random, timed one after another.

Figures: ``trace_ms`` (p50, p90, max over the traces, and the first one), ``rows_per_node``,
``segments_per_node``, ``segment_bytes_per_node`` and ``index_bytes_per_node``; then
``rebuild_trace_ms``, a trace after one node's indexes were deleted (what the first trace
after an upgrade costs: the node rebuilds each from its segment), and ``scan_ms``, the same
id looked up in one node's ledger by reading its ``id`` column with a pyarrow filter (what
a trace without indexes would cost at the least: it finds the id's own rows, not those
naming only its handle). Run it under ``flock /tmp/tickwheel-measure.lock``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from tickwheel.client import LedgerClient
from tickwheel.harness.local_cluster import LocalCluster
from tickwheel.node import LEDGER_FOLDER, Ledger, LedgerConfig, ledger_segments
from tickwheel.replication import LedgerRows

TOPIC = "traced"
START_MS = 1_700_000_000_000


def message_id(number: int) -> str:
    return f"bench-{number:09d}"


def _block_rows(event: str, first: int, count: int, now_ms: int) -> LedgerRows:
    """``event``'s rows of messages ``first`` .. ``first + count - 1`` (handle = number), at
    the same ``time_ms`` on every node (as a committed entry's stamp is)."""
    numbers = range(first, first + count)
    step = ("scheduled", "leased", "sent", "acked").index(event)
    columns: dict[str, Sequence[Any]] = {"handle": list(numbers), "topic": [TOPIC] * count,
                                     "time_ms": [now_ms + 10 * n + step for n in numbers]}
    if event in ("scheduled", "sent"):
        columns.update(id=[message_id(n) for n in numbers], attempt=[1] * count,
                       deliver_at_ms=[now_ms] * count)
    if event != "scheduled":
        columns.update(group=[""] * count, lease=[1] * count)
    if event == "leased":
        columns.update(possible_duplicate=[False] * count, deadline_ms=[now_ms + 30_000] * count)
    if event == "sent":
        columns.update(consumer=["bench-consumer"] * count, term=[1] * count, epoch=[1] * count,
                       possible_duplicate=[False] * count, slot_second=[now_ms // 1000] * count,
                       local_index=list(numbers))
    return LedgerRows(event, now_ms, columns)


def write_ledger(folder: Path, node: str, messages: int, block: int, segment_rows: int,
                 sends: bool) -> None:
    """A ledger of ``messages`` messages' lifecycles in ``folder``, as ``node`` writes it
    (``sends``: with the ``sent`` rows, as the leader's)."""
    ledger = Ledger(folder, node, LedgerConfig(max_segment_age_ms=3_600_000),
                    lambda: int(time.time() * 1000))
    ledger.start()
    since_rotation = 0
    steps = [(event, first - lag * block) for first in range(0, messages + 3 * block, block)
             for lag, events in enumerate((("scheduled",), ("leased", "sent"), ("acked",)))
             for event in events]
    for event, first in steps:
        count = min(block, messages - first)
        if first < 0 or count <= 0 or (event == "sent" and not sends):
            continue
        ledger.add(_block_rows(event, first, count, START_MS))
        since_rotation += count
        if since_rotation >= segment_rows:
            ledger.rotate()
            since_rotation = 0
    ledger.close()


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))], 1)


def measure(root: Path, messages: int, block: int, segment_rows: int, traces: int
            ) -> dict[str, Any]:
    cluster = LocalCluster(root, ledger_segment_age_ms=None)
    for number, node in enumerate(cluster.nodes):
        write_ledger(node.data / LEDGER_FOLDER, node.raft, messages, block, segment_rows,
                     sends=number == 0)
    folders = [node.data / LEDGER_FOLDER for node in cluster.nodes]
    paths = ledger_segments(folders[0])
    figures: dict[str, Any] = {
        "messages_per_node": messages,
        "rows_per_node": sum(pq.ParquetFile(path).metadata.num_rows for path in paths),
        "segments_per_node": len(paths),
        "segment_bytes_per_node": sum(path.stat().st_size for path in paths),
        "index_bytes_per_node": sum(path.stat().st_size for path in folders[0].glob("*.arrow"))}
    chosen = random.Random(7).sample(range(messages), traces + 1)
    with cluster, LedgerClient([n.grpc_address for n in cluster.nodes],
                               credentials=cluster.credentials()) as ledger:
        cluster.leaders(60)
        timings = []
        for number in chosen[:traces]:
            started = time.perf_counter()
            found = ledger.trace(message_id(number))
            timings.append((time.perf_counter() - started) * 1000)
            events = [event.event for event in found.events]
            if events != ["scheduled", "leased", "sent", "acked"] or found.missed:
                raise RuntimeError(f"{message_id(number)}: traced {events}, missed "
                                   f"{found.missed}")
        figures["trace_ms"] = {"first": round(timings[0], 1), "p50": _percentile(timings, 0.5),
                               "p90": _percentile(timings, 0.9), "max": round(max(timings), 1)}
        for path in folders[0].glob("*.arrow"):
            path.unlink()
        started = time.perf_counter()
        ledger.trace(message_id(chosen[-1]))
        figures["rebuild_trace_ms"] = round((time.perf_counter() - started) * 1000, 1)
    scans = []
    for number in chosen[:3]:
        started = time.perf_counter()
        pq.read_table(paths, columns=["id", "handle"], filters=[("id", "==", message_id(number))])
        scans.append((time.perf_counter() - started) * 1000)
    figures["scan_ms"] = round(statistics.median(scans), 1)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--messages", type=int, default=250_000, help="per node (4 rows each)")
    parser.add_argument("--block", type=int, default=16_384)
    parser.add_argument("--segment-rows", type=int, default=250_000)
    parser.add_argument("--traces", type=int, default=30)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tickwheel-trace-bench-") as root:
        figures = measure(Path(root), args.messages, args.block, args.segment_rows,
                          args.traces)
    print(json.dumps(figures, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
