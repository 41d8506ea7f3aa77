"""Benchmark of the wheel engine: ``python -m tickwheel.harness.wheel_bench --json [--quick]``.

Schedules ``--messages`` (1,000,000) messages with 100-byte bodies in batches of 1,000, due
uniformly over ``--days`` (30) days; reopens the wheel; then takes every message as due, moving
the cursor after each batch the way a dispatcher does once messages are acknowledged.
Prints one JSON object. An in-memory ``heapq`` of the same messages (push all, then pop all),
measured in the same run, is the baseline the ratios compare against: what a hand-written
sorted-set queue does, with no durability and O(pending) memory. This machine is shared, so the
ratios are steadier than the absolute figures.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import json
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tickwheel.wheel import Cursor, NewMessage, Wheel

BATCH_MSGS = 1_000
BODY = bytes(range(100))
START_MS = 1_800_000_000_000  # a fixed instant, so runs are comparable


def _batches(count: int, span_ms: int, seed: int) -> Iterator[list[NewMessage]]:
    rng = random.Random(seed)
    for first in range(0, count, BATCH_MSGS):
        yield [NewMessage(f"m{i}", "orders", BODY, START_MS + rng.randrange(span_ms))
               for i in range(first, min(first + BATCH_MSGS, count))]


def _rss_kib(field: str = "VmRSS") -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _bytes_named(root: Path, name: str) -> int:
    return sum(path.stat().st_size for path in root.glob(f"hours/*/{name}"))


def run(count: int, days: int, root: Path) -> dict[str, float | None]:
    span_ms = days * 86_400_000
    gc.collect()  # garbage left by earlier work must not be freed inside the measurement
    rss_before_kib = _rss_kib()
    wheel = Wheel.open(root)
    insert_s = 0.0
    for batch in _batches(count, span_ms, seed=1):
        started = time.perf_counter()
        wheel.schedule(batch, START_MS)
        insert_s += time.perf_counter() - started
    started = time.perf_counter()
    wheel.flush()
    insert_s += time.perf_counter() - started
    rss_growth_mb = (_rss_kib() - rss_before_kib) / 1024
    rss_anon_mb = _rss_kib("RssAnon") / 1024
    wheel.close()
    index_bytes, heads_bytes = _bytes_named(root, "index"), _bytes_named(root, "heads")
    log_bytes = _bytes_named(root, "log")

    started = time.perf_counter()
    wheel = Wheel.open(root)
    first_due_ms = wheel.next_due_ms()
    reopen_s = time.perf_counter() - started
    assert first_due_ms is not None and first_due_ms >= START_MS

    end_ms = START_MS + span_ms
    taken, started = 0, time.perf_counter()
    while batch_due := wheel.take_due(end_ms, BATCH_MSGS):
        taken += len(batch_due)
        wheel.advance_cursor(Cursor(batch_due[-1].slot_second, 0))
    due_s = time.perf_counter() - started
    wheel.close()
    assert taken == count, f"took {taken} of {count}"

    started = time.perf_counter()
    heap: list[tuple[int, str, bytes]] = []
    for batch in _batches(count, span_ms, seed=1):
        for message in batch:
            heapq.heappush(heap, (message.deliver_at_ms, message.id, message.body))
    baseline_s = time.perf_counter() - started
    started = time.perf_counter()
    while heap:
        heapq.heappop(heap)
    baseline_pop_s = time.perf_counter() - started
    insert_msgs_per_s, due_msgs_per_s = count / insert_s, count / due_s
    baseline_msgs_per_s, baseline_pop_msgs_per_s = count / baseline_s, count / baseline_pop_s
    return {
        "messages": count,
        "days": days,
        "insert_msgs_per_s": round(insert_msgs_per_s),
        "due_msgs_per_s": round(due_msgs_per_s),
        # measured, never extrapolated: growth is mostly per open hour, not per message
        "rss_mb_1m_pending": round(rss_growth_mb, 1) if count == 1_000_000 else None,
        "rss_growth_mb": round(rss_growth_mb, 1),
        "rss_anon_mb_total": round(rss_anon_mb, 1),
        "reopen_s_1m_pending": round(reopen_s, 4) if count == 1_000_000 else None,
        "reopen_s": round(reopen_s, 4),
        "index_bytes_per_msg": round(index_bytes / count, 1),
        "heads_bytes_per_msg": round(heads_bytes / count, 1),
        "log_bytes_per_msg": round(log_bytes / count, 1),
        "baseline_heapq_insert_msgs_per_s": round(baseline_msgs_per_s),
        "insert_vs_heapq_ratio": round(insert_msgs_per_s / baseline_msgs_per_s, 3),
        "baseline_heapq_pop_msgs_per_s": round(baseline_pop_msgs_per_s),
        "due_vs_heapq_ratio": round(due_msgs_per_s / baseline_pop_msgs_per_s, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--quick", action="store_true", help="50,000 messages instead of 1 M")
    parser.add_argument("--messages", type=int, help="how many messages (overrides --quick)")
    parser.add_argument("--days", type=int, default=30, help="spread of due times, in days")
    parser.add_argument("--dir", type=Path, help="where to put the data (default: a temp dir)")
    args = parser.parse_args(argv)
    count = args.messages or (50_000 if args.quick else 1_000_000)
    root = Path(tempfile.mkdtemp(prefix="tickwheel-bench-", dir=args.dir))
    try:
        figures = run(count, args.days, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if not args.json:
        print(f"wheel benchmark, {count:,} messages over {args.days} days:", file=sys.stderr)
    print(json.dumps(figures, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
