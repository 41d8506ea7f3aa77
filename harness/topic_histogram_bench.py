"""Benchmark of the due-time histogram of one topic (``DueHistogram`` with a topic,
`tickwheel.wheel.tag_hours`): ``python -m tickwheel.harness.topic_histogram_bench --json
[--messages N] [--topics T]``.

Files ``--messages`` (1,000,000) pending messages with 100-byte bodies, of ``--topics`` (10)
tags in turn, due over the next year (nine tenths, in time order, batches of 10,000) and the
next day (a tenth), and cancels 1% of them. Then times, ``--rounds`` times each span the API
answers (minute, hour, day, year), `Wheel.due_histogram` of one tag: right after filing, and
after the wheel is reopened; and what the reopening costs: `Wheel.open` whole, of which the
count of every hour's units by tag (`TagHours.rebuild`), timed again alone. Reports the
counts' memory (the arrays of `TagHours`, and the formula's bound) and checks that the tags'
counts add up to the every-topic histogram's. Prints one JSON object; in-process (the API
adds a gRPC round trip).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tickwheel.harness.histogram_bench import BATCH_MSGS, BODY, DAY_MS, NOW_MS, time_spans
from tickwheel.wheel import NewMessage, Wheel, encode_record


def _fill(wheel: Wheel, count: int, span_ms: int, topics: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    due = sorted(NOW_MS + rng.randrange(span_ms) for _ in range(count))
    handles: list[int] = []
    for first in range(0, count, BATCH_MSGS):
        numbers = range(first, min(first + BATCH_MSGS, count))
        records = [encode_record(*NewMessage(f"m{seed}-{i}", "orders", BODY, due[i]))
                   for i in numbers]
        handles += wheel.schedule_records(records, [due[i] for i in numbers], NOW_MS,
                                          [1 + i % topics for i in numbers])
    return handles


def _adds_up(wheel: Wheel, topics: int) -> bool:
    start = NOW_MS // 1_000 - NOW_MS // 1_000 % 3_600
    whole = wheel.due_histogram(start, 86_400, 366)
    tags = [wheel.due_histogram(start, 86_400, 366, tag) for tag in range(1, topics + 1)]
    return list(whole.counts) == [sum(c) for c in zip(*(t.counts for t in tags), strict=True)]


def run(messages: int, topics: int, rounds: int, root: Path) -> dict[str, object]:
    wheel = Wheel.open(root)
    began = time.perf_counter()
    handles = _fill(wheel, messages - messages // 10, 365 * DAY_MS, topics, seed=1)
    handles += _fill(wheel, messages // 10, DAY_MS, topics, seed=2)
    for handle in random.Random(3).sample(handles, k=messages // 100):
        wheel.cancel(handle)
    filed_s = time.perf_counter() - began
    filed = time_spans(wheel, rounds, tag=1)
    wheel.close()
    began = time.perf_counter()
    reopened = Wheel.open(root)
    open_ms = (time.perf_counter() - began) * 1_000
    hours = reopened._hours
    began = time.perf_counter()
    hours.tag_hours.rebuild(hours.dir, hours.hours)
    rebuild_ms = (time.perf_counter() - began) * 1_000
    arrays = hours.tag_hours._hours
    memory_bytes = sys.getsizeof(arrays) + sum(sys.getsizeof(a) for a in arrays.values())
    cold = time_spans(reopened, rounds, tag=1)
    adds_up = _adds_up(reopened, topics)
    reopened.close()
    return {"messages": messages, "topics": topics, "hours": len(arrays),
            "filed_s": round(filed_s, 1), "open_ms": round(open_ms, 1),
            "rebuild_ms": round(rebuild_ms, 1), "counts_memory_bytes": memory_bytes,
            "bound_bytes": 4 * (topics + 1) * len(arrays), "tags_add_up": adds_up,
            "after_filing": filed, "after_reopen": cold}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--topics", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tickwheel-topic-histogram-"))
    try:
        print(json.dumps(run(args.messages, args.topics, args.rounds, root / "wheel")))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
