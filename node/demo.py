"""``make demo`` for now: the storage engine on a real clock, in one process.

Schedules a dozen messages due over the next few seconds (plus one overdue, one cancelled, and
one a year ahead) into a fresh wheel, then dispatches them as they come due and prints each with
its lateness. The replicated three-node demo replaces this when the node exists (issue 4).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime

from tickwheel.wheel import Cursor, NewMessage, Wheel
from tickwheel.wheel.types import DAY_MS


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def run(clock_ms: Callable[[], int], sleep_s: Callable[[float], None], data_dir: str,
        seed: int) -> int:
    """Run the demo; returns how many messages were delivered."""
    rng = random.Random(seed)
    now_ms = clock_ms()
    messages = [NewMessage(f"order-{i}", "orders", f"close unpaid order {i}".encode(),
                           now_ms + rng.randrange(500, 4_000)) for i in range(12)]
    messages += [NewMessage("overdue", "orders", b"was due a minute ago", now_ms - 60_000),
                 NewMessage("cancelled", "orders", b"never delivered", now_ms + 2_000),
                 NewMessage("next-year", "reminders", b"renew", now_ms + 365 * DAY_MS)]
    delivered = 0
    with Wheel.open(data_dir) as wheel:
        handles = wheel.schedule(messages, now_ms)
        wheel.cancel(handles[-2])
        print(f"scheduled {len(messages)} messages into {data_dir}; cancelled one; "
              f"one is due a year from now\n")
        print(f"{'id':<10} {'topic':<9} {'due in (ms)':>11} {'late (ms)':>9}")
        deadline_ms = now_ms + 5_000
        while (due_ms := wheel.next_due_ms()) is not None and due_ms <= deadline_ms:
            sleep_s(max(0, due_ms - clock_ms()) / 1_000)
            batch = wheel.take_due(clock_ms(), 100)
            for message in batch:
                lateness_ms = clock_ms() - message.deliver_at_ms
                print(f"{message.id:<10} {message.topic:<9} "
                      f"{message.deliver_at_ms - now_ms:>11} {lateness_ms:>9}")
            if batch:
                wheel.advance_cursor(Cursor(batch[-1].slot_second, 0))
                delivered += len(batch)
        next_ms = wheel.next_due_ms() or 0
        print(f"\n{delivered} delivered; still pending: the one due "
              f"{datetime.fromtimestamp(next_ms / 1_000, UTC):%Y-%m-%d %H:%M:%S} UTC")
    return delivered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tickwheel-demo-") as data_dir:
        delivered = run(wall_clock_ms, time.sleep, data_dir, args.seed)
    return 0 if delivered == 13 else 1


if __name__ == "__main__":
    sys.exit(main())
