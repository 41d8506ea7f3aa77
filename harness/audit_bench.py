"""``python -m tickwheel.harness.audit_bench --events N``: the production audit's throughput on
a synthetic ledger of N rows, in Spark's local mode and on a standalone cluster on this machine
(a master and two workers, `StandaloneSpark`), and the driver's memory; JSON on stdout.

The ledger (`write_ledger`, laid out as ``tickwheel ledger fetch`` writes it): 2 shards of 3
nodes; each message is scheduled, leased and acked on all three replicas and sent by its
shard's leader (10 rows); each shard's leadership moves twice (terms 1-3, each with its
``dispatch_started``); due times one a millisecond apart, sends 0-49 ms late; 4 topics of
the default group. Two faults are planted, so that the audit has something to find:
``m-0`` is never sent nor acked (overdue), and ``m-<M-1>`` is sent a second time after the
last failover without its flag (an unflagged repeat). Segments hold at most
`ROWS_PER_SEGMENT` rows, each with its manifest. Generating is vectorised (numpy, pyarrow)
and not timed.

Figures: ``audit_events_per_s`` (rows / seconds of `tickwheel.audit.audit_ledgers`, the
session already up), ``seconds``, and per mode the driver's peak memory:
``driver_python_peak_mib`` (this process) and ``driver_jvm_peak_mib`` (the driver's JVM, its
VmHWM; in local mode the executors' too, being the same JVM). Run it for a figure under
``flock /tmp/tickwheel-measure.lock``; ``--modes local`` (or ``standalone``) runs one mode, so
that a long run of each holds the lock alone, and ``--conf KEY=VALUE`` gives the audit's
session a Spark setting (``spark.sql.shuffle.partitions=32``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from tickwheel.audit import AuditOptions, audit_ledgers, build_session
from tickwheel.harness.spark_standalone import StandaloneSpark
from tickwheel.node import LEDGER_SCHEMA as SCHEMA
from tickwheel.node import LedgerManifest as Manifest
from tickwheel.node import ledger_node_token as node_token

ROWS_PER_SEGMENT: Final = 2_000_000
SHARDS: Final = 2
NODES: Final = ("10.0.0.1:7500", "10.0.0.2:7500", "10.0.0.3:7500")
T0_MS: Final = 1_750_000_000_000
ROWS_PER_MESSAGE: Final = 10


def write_ledger(folder: Path, events: int) -> int:
    """The synthetic ledger of about ``events`` rows under ``folder``; returns its rows."""
    per_shard = max(2, events // ROWS_PER_MESSAGE // SHARDS)
    written = 0
    for shard in range(SHARDS):
        first = shard * per_shard
        numbers = np.arange(first, first + per_shard, dtype=np.int64)
        tables = _shard_tables(numbers, per_shard)
        for node_number, node in enumerate(NODES):
            own = tables["own"](node, node_number)
            table = pa.concat_tables([tables["committed"](node, node_number), own])
            table = table.sort_by([("node_ms", "ascending")])
            written += table.num_rows
            _write_segments(folder / f"shard-{shard}" / node_token(node), node, table)
    return written


def _shard_tables(numbers: Any, count: int) -> dict[str, Any]:
    """Builders of one node's committed and own rows for the messages ``numbers``."""
    ids = pc.binary_join_element_wise("m-", pa.array(numbers).cast(pa.string()), "")
    topics = pc.binary_join_element_wise("t", pa.array(numbers % 4).cast(pa.string()), "")
    scheduled_ms = T0_MS + numbers
    due_ms = scheduled_ms + 1_000
    sent_ms = due_ms + (numbers * 7919) % 50
    terms = 1 + (numbers - numbers[0]) * 3 // count
    never = numbers == numbers[0]

    def frame(event: str, time_ms: Any, node: str, **columns: Any) -> pa.Table:
        size = len(time_ms)
        base = {"event": pa.array([event] * size), "node": pa.array([node] * size),
                "node_ms": pa.array(time_ms), "time_ms": pa.array(time_ms)}
        return pa.Table.from_pydict(
            {field.name: base.get(field.name, columns.get(field.name,
                                                          pa.nulls(size, field.type)))
             for field in SCHEMA}, schema=SCHEMA)

    def committed(node: str, _number: int) -> pa.Table:
        kept = ~never
        return pa.concat_tables([
            frame("scheduled", scheduled_ms, node, handle=pa.array(numbers), id=ids,
                  topic=topics, attempt=pa.array(np.ones(count, np.int64)),
                  deliver_at_ms=pa.array(due_ms)),
            frame("leased", due_ms[kept], node, handle=pa.array(numbers[kept]),
                  topic=topics.filter(pa.array(kept)), group=pa.array([""] * int(kept.sum())),
                  lease=pa.array(np.ones(int(kept.sum()), np.int64)),
                  possible_duplicate=pa.array(np.zeros(int(kept.sum()), bool))),
            frame("acked", sent_ms[kept] + 5, node, handle=pa.array(numbers[kept]),
                  topic=topics.filter(pa.array(kept)), group=pa.array([""] * int(kept.sum())),
                  lease=pa.array(np.ones(int(kept.sum()), np.int64)))])

    def own(node: str, number: int) -> pa.Table:
        mine = (terms == number + 1) & ~never
        size = int(mine.sum())
        tables = [frame("dispatch_started", np.array([int(sent_ms[mine].min()) - 10]), node,
                        term=pa.array([number + 1]), epoch=pa.array([number + 1]))] if size else []
        tables.append(frame(
            "sent", sent_ms[mine], node, term=pa.array(terms[mine]), epoch=pa.array(terms[mine]),
            handle=pa.array(numbers[mine]), id=ids.filter(pa.array(mine)),
            topic=topics.filter(pa.array(mine)), group=pa.array([""] * size),
            consumer=pa.array(["c"] * size), lease=pa.array(np.ones(size, np.int64)),
            possible_duplicate=pa.array(np.zeros(size, bool)),
            attempt=pa.array(np.ones(size, np.int64)), deliver_at_ms=pa.array(due_ms[mine])))
        if number == len(NODES) - 1:  # the planted resend, unflagged, of the last message
            last = len(numbers) - 1
            tables.append(frame(
                "sent", np.array([int(sent_ms[last]) + 100]), node, term=pa.array([3]),
                epoch=pa.array([3]), handle=pa.array([int(numbers[last])]),
                id=ids.slice(last, 1), topic=topics.slice(last, 1), group=pa.array([""]),
                consumer=pa.array(["c"]), lease=pa.array([2]),
                possible_duplicate=pa.array([False]), attempt=pa.array([1]),
                deliver_at_ms=pa.array([int(due_ms[last])])))
        return pa.concat_tables(tables)

    return {"committed": committed, "own": own}


def _write_segments(folder: Path, node: str, table: pa.Table) -> None:
    """``table`` as a node's segments of at most `ROWS_PER_SEGMENT` rows, with manifests."""
    folder.mkdir(parents=True, exist_ok=True)
    for sequence, start in enumerate(range(0, table.num_rows, ROWS_PER_SEGMENT), start=1):
        part = table.slice(start, ROWS_PER_SEGMENT)
        times = part.column("node_ms")
        first_ms, last_ms = pc.min(times).as_py(), pc.max(times).as_py()
        manifest = Manifest(version=1, node=node, sequence=sequence, rows=part.num_rows,
                            first_ms=first_ms, last_ms=last_ms, opened_ms=first_ms,
                            closed_ms=last_ms)
        path = folder / f"ledger-{node_token(node)}-{sequence:012d}.parquet"
        pq.write_table(part, path, compression="zstd")
        path.with_suffix(".json").write_text(manifest.to_json(), encoding="utf-8")


def measure(spark: SparkSession, folder: Path, rows: int) -> dict[str, Any]:
    """One audit of ``folder``: its rate, its verdict, and the driver's peak memory."""
    started = time.perf_counter()
    summary = audit_ledgers(spark, folder, AuditOptions(grace_ms=5_000))
    seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 2), "audit_events_per_s": round(rows / seconds),
            "verdict": summary["verdict"], "overdue": summary["totals"]["overdue"],
            "unflagged_repeats": summary["totals"]["unflagged_repeats"],
            "driver_python_peak_mib": _peak_mib("self"),
            "driver_jvm_peak_mib": _jvm_peak_mib(spark)}


def _jvm_peak_mib(spark: SparkSession) -> int | None:
    """The driver JVM's peak resident memory."""
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[union-attr]
    return _peak_mib(str(pid))


def _peak_mib(pid: str) -> int | None:
    """A process's VmHWM (its peak resident memory) from /proc: unlike ``ru_maxrss``, which
    Linux carries across exec, it is this program's own."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    kib = next((int(line.split()[1]) for line in status.splitlines()
                if line.startswith("VmHWM:")), None)
    return None if kib is None else round(kib / 1024)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="ledger rows")
    parser.add_argument("--modes", default="local,standalone",
                        help="local (local[*]) and/or standalone (a master, two workers)")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the audit's session (repeatable)")
    parser.add_argument("--root", type=Path, help="where the ledger goes (default: a temp dir)")
    parser.add_argument("--ledger", type=Path, help=argparse.SUPPRESS)  # one mode's process
    args = parser.parse_args(argv)
    if args.ledger is not None:
        rows = sum(pq.ParquetFile(path).metadata.num_rows
                   for path in args.ledger.glob("shard-*/*/ledger-*.parquet"))
        print(json.dumps(_run_mode(args.modes, args.ledger, rows, args.driver_memory,
                                   args.conf)))
        return 0
    with tempfile.TemporaryDirectory(dir=args.root) as temp:
        root = Path(temp)
        started = time.perf_counter()
        rows = write_ledger(root / "ledger", args.events)
        result: dict[str, Any] = {"events": rows, "generate_s": round(
            time.perf_counter() - started, 1), "cores": len(os.sched_getaffinity(0))}
        for mode in args.modes.split(","):  # each in a process of its own: its own JVM
            run = subprocess.run(
                [sys.executable, "-m", "tickwheel.harness.audit_bench", "--modes", mode,
                 "--driver-memory", args.driver_memory, "--ledger", str(root / "ledger"),
                 *[f"--conf={setting}" for setting in args.conf]],
                capture_output=True, text=True, check=True)
            result[mode] = json.loads(run.stdout.strip().splitlines()[-1])
    print(json.dumps(result, indent=2))
    return 0


def _run_mode(mode: str, ledger: Path, rows: int, driver_memory: str,
              settings: list[str]) -> dict[str, Any]:
    config = dict(setting.split("=", 1) for setting in settings)
    if mode == "local":
        spark = _session("local[*]", driver_memory, config)
        try:
            return measure(spark, ledger, rows)
        finally:
            spark.stop()
    with StandaloneSpark(ledger.parent / "spark") as cluster:
        spark = _session(cluster.url, driver_memory, config)
        try:
            return measure(spark, ledger, rows) | {"workers": 2}
        finally:
            spark.stop()


def _session(master: str, driver_memory: str, config: dict[str, str]) -> SparkSession:
    return build_session(master, config={"spark.driver.memory": driver_memory, **config})


if __name__ == "__main__":
    sys.exit(main())
