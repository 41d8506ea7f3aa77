"""The storage engine: a two-level (hour / second) timing wheel with chained delay indexes.

**A simple wheel.** Give each second its own slot and put every message in the slot of the
second it is due; to dispatch, visit the slots in order. Insert is O(1); but a year ahead at
millisecond resolution is 31.6 million slots, and most of them are empty.

**Two levels.** The *hour wheel* is the ordered set of hours (``slot_second // 3600``) that hold
messages; each hour has a *second wheel* of 3,600 slots. When the second wheel completes a turn,
the hour wheel moves one slot. Hours with nothing in them do not exist, and inside an hour an
occupancy bit set per second finds the next non-empty slot directly, so the dispatcher never
steps through empty time: `Wheel.next_due_ms` answers in O(1) plus one step per non-empty hour
it passes, and an earlier arrival changes the answer (seed 003's DelayQueue).

**Slots without lists: chains (seed 003).** An hour is a folder of append-only files: ``log``
holds the records, ``index`` one fixed 40-byte unit per message ``{offset, size, local_index,
global_index, pre_global_index, deliver_at_ms, second}``. ``pre_global_index`` points at the
previous message of the same second, so each second is a linked chain, newest first, and
``heads`` keeps 3,600 ``{chain head, count}`` pairs (28.8 KiB) - all that must be in memory to
find every message of an hour. Insert appends a record and a unit pointing at the old head and
moves the head: O(1), no sorting, ever. Reading a second walks its chain.

**Preload.** The dispatcher loads the chains of the next ``preload_ms`` (10 s) into a small
in-memory heap ordered by ``(slot_second, deliver_at_ms, local_index)``; a message that arrives
for a second already loaded goes straight into the heap. Bodies are read only when a message is
handed out. Memory is O(open hours + preload window), never O(pending messages).

**The cursor.** ``(second, local_index)``: everything before it is done. A message due at or
before the cursor's second - or before the second of the batch's time stamp - is filed under the
later of the two, after what is already there, so it can never fall behind the cursor. An hour
the cursor has passed is deleted by the wheel's owner (`Wheel.delete_hour`) once no snapshot names
it.

**Costs.** insert O(1) amortised (buffered appends); cancel O(1) (a tombstone); take O(log w)
per message for a window of w units; reopen O(hours) after a clean close, plus O(units of the
hours being written) after a crash, to replay their heads from the index.

**Thread contract.** Single-threaded: one owner calls every method; no method blocks on
anything but the local file system; the wheel never reads a clock (time is passed in).

**Faces.** Above the replication layer, code imports this package's names (below) and, to damage
a stopped node's files on purpose, `tickwheel.wheel.faults`, never another module inside
(tests/test_layout.py checks it).

Worked example - three messages, a cancel, and the clock moving::

    >>> import tempfile
    >>> from tickwheel.wheel import Cursor, NewMessage, Wheel
    >>> wheel = Wheel.open(tempfile.mkdtemp())
    >>> now_ms = 7_200_000                       # 02:00:00 on day 0
    >>> late, early, gone = wheel.schedule([
    ...     NewMessage("b", "orders", b"close #2", deliver_at_ms=now_ms + 1_500),
    ...     NewMessage("a", "orders", b"close #1", deliver_at_ms=now_ms + 1_200),
    ...     NewMessage("c", "orders", b"close #3", deliver_at_ms=now_ms + 1_700),
    ... ], now_ms)
    >>> wheel.cancel(gone).name
    'CANCELLED'
    >>> wheel.cancel(gone).name                   # idempotent: a retry learns the truth
    'ALREADY_CANCELLED'
    >>> wheel.next_due_ms() - now_ms             # second 7201 is the first non-empty one
    1000
    >>> wheel.take_due(now_ms + 1_000, max_msgs=10)  # nothing is due before 1_200
    []
    >>> wheel.next_due_ms() - now_ms             # loaded now, so exact
    1200
    >>> [m.id for m in wheel.take_due(now_ms + 1_600, max_msgs=10)]
    ['a', 'b']
    >>> [m.position for m in wheel.take_due(now_ms + 1_600, max_msgs=10)]  # handed out once
    []
    >>> wheel.advance_cursor(Cursor(7_202, 0))    # both done: the cursor passes second 7201
    >>> wheel.schedule([NewMessage("d", "orders", b"overdue", deliver_at_ms=0)], now_ms)[0] > 0
    True
    >>> [(m.id, m.slot_second) for m in wheel.take_due(now_ms + 2_000, max_msgs=10)]
    [('d', 7202)]
    >>> wheel.close()
"""

from tickwheel.common.errors import (
    ClientError,
    CorruptSegment,
    InternalError,
    InvalidMessage,
    InvariantViolation,
    StorageLocked,
    TickwheelError,
    UnknownHandle,
)
from tickwheel.wheel.due import DueHistogram
from tickwheel.wheel.engine import Wheel
from tickwheel.wheel.format import encode_record
from tickwheel.wheel.mending import MendCounts
from tickwheel.wheel.types import DAY_MS, CancelResult, Cursor, DueMessage, NewMessage, WheelConfig

__all__ = [
    "DAY_MS",
    "CancelResult",
    "ClientError",
    "CorruptSegment",
    "Cursor",
    "DueHistogram",
    "DueMessage",
    "InternalError",
    "InvalidMessage",
    "InvariantViolation",
    "MendCounts",
    "NewMessage",
    "StorageLocked",
    "TickwheelError",
    "UnknownHandle",
    "Wheel",
    "WheelConfig",
    "encode_record",
]
