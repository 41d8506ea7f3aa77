"""What an item of each of the leader's bounded in-memory structures costs, in bytes:
``python tests/replication/memory_terms_bench.py --json [--items N]``.

For each structure, ``--items`` (100,000) items are added as the node adds them, and
`tracemalloc` counts the bytes Python allocated for them (what the structure holds once
built, after a collection; allocator slack is not counted):

- ``dedupe_bytes_per_id``: an id remembered by the dedupe window (its 16-byte key, handle
  and due time; `DedupeWindow.add_many`, in entries of 500 as group commit makes them);
- ``window_bytes_per_msg``: an index unit loaded into the wheel's preload window (messages
  of one topic due over a few seconds, read ahead by a take that finds none due yet);
- ``taken_bytes_per_msg``: a message taken from the wheel, its body read (`DueMessage`):
  what a leader keeps of a message readied and not granted yet, leased and not acknowledged,
  or in a hand-out not yet applied;
- ``ready_bytes_per_msg``: a message readied in a consumer group (`Groups.ready_many`);
- ``lease_bytes_per_msg``: the same message leased (`Groups.grant_many`; the ready set it
  left keeps its table);
- ``ledger_bytes_per_row``: a ``scheduled`` row waiting in the ledger's buffer, the largest
  kind (it holds the message's record: 100-byte bodies here), in entries of 500.

docs/node.md's "Memory" section multiplies them by the settings that bound each structure.
It lives beside the tests because it drives the replication layer's internals, which its
face does not offer the harness. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from tickwheel.replication import LedgerRows
from tickwheel.replication.dedupe import DedupeWindow
from tickwheel.replication.group import DEFAULT_GROUP
from tickwheel.replication.groups import Groups
from tickwheel.wheel import NewMessage, Wheel, WheelConfig
from tickwheel.wheel.format import encode_record

NOW_MS = 1_000 * 3_600_000 * 500
ENTRY_MSGS = 500
"""Messages per Raft entry under load (group commit)."""
BODY = b"x" * 100


def _traced(build: Callable[[], object]) -> int:
    """Bytes Python holds after ``build`` (kept alive while counted), beyond before it."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = build()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept
    return after - before


def dedupe(items: int, root: Path) -> int:
    window = DedupeWindow.open(root / "dedupe", 600_000, 2 * items)

    def build() -> object:
        for start in range(0, items, ENTRY_MSGS):
            count = min(ENTRY_MSGS, items - start)
            keys = [(start + i).to_bytes(16, "little") for i in range(count)]
            handles = [(1 << 62) + start + i for i in range(count)]
            window.add_many(keys, handles, [NOW_MS + 5_000] * count, NOW_MS)
        return window
    return _traced(build)


def window(items: int, root: Path) -> tuple[int, int, int]:
    config = WheelConfig(max_window_msgs=items, max_load_units=items)
    wheel = Wheel.open(root / "wheel", config)
    for start in range(0, items, ENTRY_MSGS):
        count = min(ENTRY_MSGS, items - start)
        dues = [NOW_MS + 5_000 + (start + i) * 3_000 // items for i in range(count)]
        records = [encode_record(*NewMessage(f"id-{start + i}", "burst", BODY, due, {}))
                   for i, due in enumerate(dues)]
        wheel.schedule_records(records, dues, NOW_MS, [1] * count)
    wheel.flush()
    size = _traced(lambda: wheel.take_due(NOW_MS, items))
    loaded = wheel.window_msgs
    taken = _traced(lambda: wheel.take_due(NOW_MS + 10_000, items))
    wheel.close()
    return size, loaded, taken


def groups(items: int) -> tuple[int, int]:
    table = Groups(max_ready_msgs=2 * items, max_groups=16)
    handles = [(1 << 62) + i for i in range(items)]
    table.ready(handles[0], "burst", None, NOW_MS)

    def ready() -> object:
        for start in range(1, items, ENTRY_MSGS):
            table.ready_many([(h, "burst", None) for h in handles[start:start + ENTRY_MSGS]],
                             NOW_MS)
        return table
    ready_size = _traced(ready)

    def grant() -> object:
        for start in range(0, items, ENTRY_MSGS):
            table.grant_many([(h, 0, 1, (h * 2_654_435_761) & ((1 << 63) - 1),
                               NOW_MS + 30_000 + start, 0)
                              for h in handles[start:start + ENTRY_MSGS]],
                             ["burst", DEFAULT_GROUP])
        return table
    lease_size = _traced(grant)
    return ready_size, lease_size


def ledger_rows(items: int) -> int:
    def build() -> object:
        rows = []
        for start in range(0, items, ENTRY_MSGS):
            count = min(ENTRY_MSGS, items - start)
            records = [encode_record(*NewMessage(f"id-{start + i}", "burst", BODY,
                                                 NOW_MS + 5_000, {})) for i in range(count)]
            rows.append(LedgerRows("scheduled", NOW_MS, {
                "handle": [(1 << 62) + start + i for i in range(count)],
                "deliver_at_ms": [NOW_MS + 5_000 + i for i in range(count)],
                "principal": ["producer"] * count}, records))
        return rows
    return _traced(build)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--items", type=int, default=100_000)
    args = parser.parse_args(argv)
    items = args.items
    with tempfile.TemporaryDirectory() as root:
        dedupe_size = dedupe(items, Path(root))
        window_size, loaded, taken_size = window(items, Path(root))
    ready_size, lease_size = groups(items)
    ledger_size = ledger_rows(items)
    figures = {"items": items,
               "dedupe_bytes_per_id": round(dedupe_size / items, 1),
               "window_msgs_loaded": loaded,
               "window_bytes_per_msg": round(window_size / max(loaded, 1), 1),
               "taken_bytes_per_msg": round(taken_size / items, 1),
               "ready_bytes_per_msg": round(ready_size / items, 1),
               "lease_bytes_per_msg": round(lease_size / items, 1),
               "ledger_bytes_per_row": round(ledger_size / items, 1)}
    print(json.dumps(figures, indent=2 if args.json else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
