"""``python -m tickwheel.harness.readahead_bench --json``: the cursor's read-ahead, turn by turn.

The Raft thread calls `Wheel.walk_ahead` once a turn, with up to 4,000 index units of reading
(`tickwheel.replication.replica.WALK_AHEAD_UNITS`), and every request that waits for that turn
waits for the reading too. This files what the replication bench files before its commit-latency
load (``--messages`` 200,000 in one second two hours ahead, 500 a request, a turn after each
request), then runs ``--turns`` (60) turns more, and prints what the turns read: units, total
and longest milliseconds, turns over 1 ms, while filing and after. ``now_ms`` as the replica
passes it, and ``unbounded`` (``now_ms=None``: a second read at any distance, as before
2026-11-29) for comparison. One process, no node; the user is whoever measures the wheel.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tickwheel.wheel import NewMessage, Wheel

NOW_MS = 1_800_000_000_000
AHEAD_MS = 2 * 3_600_000
REQUEST_MSGS = 500
WALK_UNITS = 4_000
BODY = b"x" * 100


def _turns(wheel: Wheel, now_ms: int | None, count: int) -> dict[str, float]:
    """``count`` turns of `Wheel.walk_ahead`: the units they read and how long they took."""
    read_before, total_s, longest_s, slow = wheel.passage_units_read, 0.0, 0.0, 0
    for _ in range(count):
        started = time.perf_counter()
        wheel.walk_ahead(WALK_UNITS, now_ms)
        took_s = time.perf_counter() - started
        total_s, longest_s, slow = total_s + took_s, max(longest_s, took_s), slow + (took_s > 1e-3)
    return {"units": wheel.passage_units_read - read_before, "ms": round(total_s * 1000, 1),
            "longest_ms": round(longest_s * 1000, 2), "turns_over_1ms": slow}


def run(root: Path, messages: int, turns: int, now_ms: int | None) -> dict[str, Any]:
    with Wheel.open(root) as wheel:
        filing = {"units": 0, "ms": 0.0, "longest_ms": 0.0, "turns_over_1ms": 0}
        for request in range(messages // REQUEST_MSGS):
            wheel.schedule([NewMessage(f"r{request}-{i}", "bench", BODY,
                                       NOW_MS + AHEAD_MS + i, {})
                            for i in range(REQUEST_MSGS)], NOW_MS)
            turn = _turns(wheel, now_ms, 1)
            filing = {"units": filing["units"] + turn["units"],
                      "ms": round(filing["ms"] + turn["ms"], 1),
                      "longest_ms": max(filing["longest_ms"], turn["longest_ms"]),
                      "turns_over_1ms": filing["turns_over_1ms"] + turn["turns_over_1ms"]}
        return {"while_filing": filing, "after": _turns(wheel, now_ms, turns)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one line of JSON")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--turns", type=int, default=60)
    args = parser.parse_args(argv)
    figures: dict[str, Any] = {"messages": args.messages}
    for name, now_ms in (("now_ms", NOW_MS), ("unbounded", None)):
        with tempfile.TemporaryDirectory(prefix="tickwheel-readahead-") as root:
            figures[name] = run(Path(root), args.messages, args.turns, now_ms)
    print(json.dumps(figures, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
