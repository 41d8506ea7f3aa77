"""Benchmark of who asked in the log: ``python tests/replication/principal_bench.py --json
[--messages N] [--per-entry M] [--principals P] [--rounds R]``.

A state machine (with a ledger sink that keeps the rows, as the node's buffer does) applies
``--messages`` (200,000) new messages of 100-byte bodies in entries of ``--per-entry`` (500,
what group commit packs under load), once as plain ``schedule`` entries and once as
``schedule_by`` entries whose messages come from ``--principals`` (1) principals of 14
characters in turn (a request's run each), alternately ``--rounds`` (5) times each. Figures:
the bytes an entry grows by; the apply cost per message of each layout (the fastest and the
median of the rounds: other work on the machine only adds to a round) and their difference,
as a share of a core at 20,000 messages a second; and the cost of reading the entries alone
(``commands.read_schedule``, the fastest of the rounds), where the section is parsed. It lives
beside the tests because it drives the state machine, which the replication layer's face does
not offer the harness. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tickwheel.replication import LedgerRows, commands
from tickwheel.replication.state import StateConfig, StateMachine
from tickwheel.wheel import NewMessage

NOW_MS = 1_800_000_000_000
BODY = bytes(range(100))
RATE_MSGS_S = 20_000


class Kept:
    def __init__(self) -> None:
        self.rows = 0

    def add(self, rows: LedgerRows) -> None:
        self.rows += rows.size


def entries(count: int, per_entry: int, principals: int, named: bool, tag: str) -> list[bytes]:
    """The entries to apply: ``count`` messages due within an hour."""
    made = []
    names = [f"tenant-{index:07d}" for index in range(principals)]
    for first in range(0, count, per_entry):
        size = min(per_entry, count - first)
        parts = [commands.encoded_message(NewMessage(
            f"{tag}-{first + i}", "bench", BODY, NOW_MS + 1_000 + (first + i) % 3_600_000))
            for i in range(size)]
        runs = [(names[(first + i) % principals], 1) for i in range(size)] if named else None
        made.append(commands.schedule(NOW_MS, parts, runs))
    return made


def applied_us_per_msg(made: list[bytes], count: int) -> float:
    with tempfile.TemporaryDirectory() as folder:
        state = StateMachine.open(Path(folder), StateConfig(), fresh=True, ledger=Kept())
        try:
            started = time.perf_counter()
            for entry in made:
                state.apply(entry)
            return (time.perf_counter() - started) * 1e6 / count
        finally:
            state.close()


def read_us_per_msg(made: list[bytes], count: int) -> float:
    started = time.perf_counter()
    for entry in made:
        commands.read_schedule(entry)
    return (time.perf_counter() - started) * 1e6 / count


def measure(count: int, per_entry: int, principals: int, rounds: int) -> dict[str, Any]:
    plain = entries(count, per_entry, principals, False, "p")
    named = entries(count, per_entry, principals, True, "n")
    times: dict[str, list[float]] = {"schedule": [], "schedule_by": []}
    reads: dict[str, list[float]] = {"schedule": [], "schedule_by": []}
    for _ in range(rounds):
        times["schedule"].append(applied_us_per_msg(plain, count))
        times["schedule_by"].append(applied_us_per_msg(named, count))
        reads["schedule"].append(read_us_per_msg(plain, count))
        reads["schedule_by"].append(read_us_per_msg(named, count))
    medians = {kind: statistics.median(values) for kind, values in times.items()}
    fastest = {kind: min(values) for kind, values in times.items()}
    extra_us = fastest["schedule_by"] - fastest["schedule"]
    return {"messages": count, "per_entry": per_entry, "principals": principals,
            "rounds": rounds, "entry_bytes": len(plain[0]),
            "entry_growth_bytes": len(named[0]) - len(plain[0]),
            "apply_us_per_msg": {kind: round(value, 3) for kind, value in fastest.items()},
            "apply_median_us_per_msg": {kind: round(v, 3) for kind, v in medians.items()},
            "read_us_per_msg": {kind: round(min(values), 3) for kind, values in reads.items()},
            "runs_us_per_msg": {kind: [round(v, 3) for v in values]
                                for kind, values in times.items()},
            "extra_us_per_msg": round(extra_us, 3),
            "extra_core_share_at_20000_msg_s": round(extra_us * RATE_MSGS_S / 1e6, 5)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--per-entry", type=int, default=500)
    parser.add_argument("--principals", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output)")
    args = parser.parse_args(argv)
    result = measure(args.messages, args.per_entry, args.principals, args.rounds)
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
