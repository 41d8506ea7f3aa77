"""Benchmark of the due-time histogram (``DueHistogram``, `tickwheel.wheel.due`):
``python -m tickwheel.harness.histogram_bench --json [--messages N]``.

Files ``--messages`` (1,000,000) pending messages with 100-byte bodies in a wheel, due over
the next year (in time order, as batches of 10,000), then the next day, and cancels 1% of
them; then times `Wheel.due_histogram` for each span the API answers (minute, hour, day,
year), ``--rounds`` times each: right after filing (the hours beyond ``max_open_hours``
closed, their counts noted as they closed), and after the wheel is reopened (every hour
closed: the first call reads two file sizes an hour, the next ones what it noted); the
first call of each span and the median and maximum of the others. For scale, the same run
times one read of every index unit of a single hour of the busy day: what a scan of the
wheel would pay per hour. Prints one JSON object. In-process: the API adds a gRPC round
trip and the pending totals.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from tickwheel.wheel import NewMessage, Wheel, WheelConfig

BATCH_MSGS = 10_000
BODY = bytes(range(100))
NOW_MS = 1_800_000_000_000
DAY_MS = 86_400_000
SPANS = {"minute": (1, 60, False), "hour": (60, 60, False), "day": (3_600, 24, True),
         "year": (86_400, 366, True)}
"""As `tickwheel.node.api.info` asks the wheel: bucket seconds, buckets, from the hour."""


def _fill(wheel: Wheel, count: int, span_ms: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    due = sorted(NOW_MS + rng.randrange(span_ms) for _ in range(count))
    handles: list[int] = []
    for first in range(0, count, BATCH_MSGS):
        batch = [NewMessage(f"m{seed}-{i}", "orders", BODY, due[i])
                 for i in range(first, min(first + BATCH_MSGS, count))]
        handles += wheel.schedule(batch, NOW_MS)
    return handles


def time_spans(wheel: Wheel, rounds: int, tag: int | None = None
               ) -> dict[str, dict[str, float]]:
    """``rounds`` calls of each span (of one ``tag``, or of every one): the first call's
    time, the median and maximum of the others, and what they counted."""
    timed: dict[str, dict[str, float]] = {}
    for span, (bucket_s, buckets, by_hour) in SPANS.items():
        start = NOW_MS // 1_000
        start -= start % 3_600 if by_hour else 0
        took_ms = []
        for _ in range(rounds):
            began = time.perf_counter()
            counted = wheel.due_histogram(start, bucket_s, buckets, tag)
            took_ms.append((time.perf_counter() - began) * 1_000)
        timed[span] = {"first_ms": round(took_ms[0], 3),
                       "median_ms": round(statistics.median(took_ms[1:] or took_ms), 3),
                       "max_ms": round(max(took_ms[1:] or took_ms), 3),
                       "counted": sum(counted.counts) + counted.overdue + counted.beyond}
    return timed


def run(messages: int, rounds: int, root: Path) -> dict[str, object]:
    wheel = Wheel.open(root)
    began = time.perf_counter()
    handles = _fill(wheel, messages - messages // 10, 365 * DAY_MS, seed=1)
    handles += _fill(wheel, messages // 10, DAY_MS, seed=2)
    cancelled = random.Random(3).sample(handles, k=messages // 100)
    for handle in cancelled:
        wheel.cancel(handle)
    filed_s = time.perf_counter() - began
    hours = len(wheel.hours)
    filed = time_spans(wheel, rounds)
    wheel.close()
    reopened = Wheel.open(root)
    cold = time_spans(reopened, rounds)
    busiest = max(reopened.hours[:30], key=reopened.count_at)
    began = time.perf_counter()
    scanned = sum(1 for _ in _units_of_hour(reopened, busiest))
    scan_ms = (time.perf_counter() - began) * 1_000
    reopened.close()
    return {"messages": messages, "cancelled": len(cancelled),
            "pending": messages - len(cancelled), "hours": hours,
            "filed_s": round(filed_s, 2), "rounds": rounds,
            "max_open_hours": WheelConfig().max_open_hours,
            "after_filing": filed, "after_reopening": cold,
            "one_hour_scan": {"units": scanned, "ms": round(scan_ms, 1)}}


def _units_of_hour(wheel: Wheel, hour: int) -> list[tuple[int, ...]]:
    """Every index unit of ``hour``, read one by one, as a scan of the wheel would."""
    segment = wheel._hours.existing(hour)  # the scan compared against
    return [segment.read_unit(i) for i in range(segment.units)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tickwheel.harness.histogram_bench",
                                     description=__doc__)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output)")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="histogram-bench-"))
    try:
        print(json.dumps(run(args.messages, args.rounds, root), indent=2))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
