"""The ledger's file format: one Parquet schema for every event, the segments' names, the
key-value metadata each segment carries and its sidecar manifest.

A node's ledger is a folder of *segments*, ``ledger-<node>-<sequence>.parquet``: ``<node>`` is
the node's Raft address with every character outside ``[A-Za-z0-9._-]`` made ``_``, and
``<sequence>`` twelve digits, from 1, one more per segment this node ever began (never
reused, also across restarts). Beside each closed segment lies its manifest,
``ledger-<node>-<sequence>.json`` (`Manifest`). A segment being written is
``ledger-<node>-<sequence>.parquet.open``: readers never see it; a node killed while writing
one leaves it torn, and at its next start deletes it and records the gap.

Every row is one event (the ``event`` column, `EVENTS`); the other columns are null where an
event has no such value (`COLUMNS` says which event fills which). Times are milliseconds
since the Unix epoch. This module is the one place the format is declared: the writer
(`tickwheel.node.ledger.writer`) builds its batches from `SCHEMA`, the chaos audit reads the
segments with Spark (`tickwheel.chaos.run_logs`), and docs/node.md's "The ledger" copies
the table below.

The schema only grows, by columns added at its end, each with the `FORMAT_VERSION` that
brought it (`ADDED`); a segment of an older version lacks them, and every reader reads them
as null there (Spark and ``pq.read_table`` by the schema they are given, `conformed` for a
table read as it is).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import pyarrow as pa

FORMAT_VERSION: Final = 2
"""Of the schema and the metadata (a segment's manifest says its own): 1, the first; 2 adds
``principal``."""

EVENTS: Final = ("scheduled", "cancelled", "withdrawn", "rescheduled", "leased", "acked",
                 "released", "returned", "nacked", "dead_lettered", "sent", "dispatch_started")
"""Every value of the ``event`` column. All but the last two are the committed lifecycle,
recorded by every replica as it applies the Raft log; ``sent`` and ``dispatch_started`` are
this node's own, while it leads."""

COLUMNS: Final = (
    ("event", pa.string(), "one of EVENTS"),
    ("node", pa.string(), "the node's Raft address (every row)"),
    ("node_ms", pa.int64(), "when the node handed the row to its ledger, by its own clock "
                            "(every row)"),
    ("time_ms", pa.int64(), "the cluster's time of the event (every row): a committed "
                            "event's Raft entry stamp (the leader's clock when it proposed "
                            "it); a send's time (when the consumer may use it); a dispatch "
                            "start's takeover time"),
    ("term", pa.int64(), "sent, dispatch_started: the Raft term the node leads in"),
    ("epoch", pa.int64(), "sent, dispatch_started: the dispatch epoch"),
    ("handle", pa.int64(), "the message's replicated handle (not the one clients see): every "
                           "event but dispatch_started; for rescheduled, the copy retired"),
    ("new_handle", pa.int64(), "rescheduled, nacked, dead_lettered: the copy filed"),
    ("id", pa.string(), "scheduled, cancelled, rescheduled, nacked, dead_lettered, sent"),
    ("topic", pa.string(), "every message event; nacked, dead_lettered: the copy's topic "
                           "(%DLQ%... for dead_lettered); null for an ack of a group gone"),
    ("group", pa.string(), "leased, acked, released, returned, nacked, dead_lettered, sent: "
                           "the consumer group (\"\": the topic's default group)"),
    ("consumer", pa.string(), "sent: the consumer's name"),
    ("lease", pa.int64(), "leased, acked, released, returned, nacked, dead_lettered, sent: "
                          "the lease's number in its group (1 for the first)"),
    ("possible_duplicate", pa.bool_(), "leased, sent: an earlier lease of the message in "
                                       "the group may have reached a consumer"),
    ("attempt", pa.int64(), "scheduled (1), nacked and dead_lettered (the copy's), sent"),
    ("deliver_at_ms", pa.int64(), "scheduled, cancelled, sent: the due time; rescheduled, "
                                  "nacked, dead_lettered: the copy's"),
    ("old_deliver_at_ms", pa.int64(), "rescheduled: the due time before"),
    ("deadline_ms", pa.int64(), "leased: the lease's deadline (cluster time)"),
    ("slot_second", pa.int64(), "sent: the message's second in the wheel; dispatch_started: "
                                "the cursor's"),
    ("local_index", pa.int64(), "sent: its index in that second; dispatch_started: the "
                                "cursor's"),
    ("principal", pa.string(), "scheduled, cancelled, rescheduled: who asked, as the access "
                               "file names the principal (\"\": a node without "
                               "authentication, or an entry of cluster version 1)"),
)
"""``(name, type, which events fill it)`` of every column, in order."""

ADDED: Final = {"principal": 2}
"""The columns added since version 1, each with the version that brought it."""
REQUIRED: Final = frozenset({"event", "node", "node_ms", "time_ms"})
SCHEMA: Final = pa.schema([pa.field(name, kind, nullable=name not in REQUIRED)
                           for name, kind, _ in COLUMNS])

DICTIONARY_COLUMNS: Final = ("event", "node", "topic", "group", "consumer", "term", "epoch",
                              "lease", "attempt", "principal")
"""Columns of few distinct values, dictionary-encoded in the Parquet file (one small dictionary
a row group). The others (ids, handles, times) would overflow a dictionary page, which Parquet
then abandons after paying for it."""
DELTA_COLUMNS: Final = ("node_ms", "time_ms", "handle", "new_handle", "deliver_at_ms",
                        "old_deliver_at_ms", "deadline_ms", "slot_second", "local_index")
"""``int64`` columns whose neighbouring values are close (times, handles given out in order),
written ``DELTA_BINARY_PACKED``."""
WRITE_OPTIONS: Final = {"compression": "zstd", "write_page_checksum": True,
                        "use_dictionary": list(DICTIONARY_COLUMNS),
                        "column_encoding": dict.fromkeys(DELTA_COLUMNS, "DELTA_BINARY_PACKED")}
"""How a segment is written (`pyarrow.parquet.ParquetWriter`'s arguments): zstd, page
checksums on, and the encodings above; every Parquet reader decodes them, so they are not part
of `FORMAT_VERSION`."""

META_PREFIX: Final = "tickwheel.ledger."
"""Key-value metadata of a segment's Parquet footer: ``tickwheel.ledger.<field>`` for every
field of `Manifest` but ``bytes`` and ``sha256`` (which a file cannot hold of itself), each
value a string (JSON for ``gaps``)."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
SEGMENT = re.compile(r"^ledger-(?P<node>[A-Za-z0-9._-]+)-(?P<sequence>\d{12})\.parquet$")


@dataclass(frozen=True, slots=True)
class Gap:
    """Rows that are not in any segment, recorded in the segment being written (else the
    next one begun)."""

    reason: str
    """``buffer_full`` (the ledger's buffer was full), ``disk_low`` (the disk was below the
    node's reserve), ``torn_segment`` (what a node killed had not closed into a segment:
    its open segment's rows and its buffered ones, recorded at its next start,
    `tickwheel.node.ledger.writer`), ``write_failed`` (an error writing a segment)."""
    rows: int | None = None
    """How many rows (None for a torn segment: unknown)."""
    first_ms: int | None = None
    last_ms: int | None = None
    """``node_ms`` of the first and last row lost."""
    sequence: int | None = None
    """A torn or failed segment's sequence number."""


@dataclass(frozen=True, slots=True)
class Manifest:
    """What one closed segment holds: its Parquet metadata, and its sidecar JSON file."""

    version: int
    node: str
    sequence: int
    rows: int
    first_ms: int
    last_ms: int
    """The ``node_ms`` of its first and last row."""
    opened_ms: int
    closed_ms: int
    """When the node began and closed it, by its own clock."""
    gaps: list[Gap] = field(default_factory=list)
    """Rows lost since the segment before it (its sequence number minus one) closed, until
    this one closed."""
    bytes: int = 0
    sha256: str = ""
    """Of the segment's file (the sidecar only)."""
    complete_ms: int | None = None
    """Every row the node stamped before it (its clock) is in this segment, an earlier one or
    a gap: when the writer took the last rows it wrote here. None in manifests written before
    it was kept."""

    def metadata(self) -> dict[str, str]:
        """The Parquet key-value metadata."""
        plain = asdict(self)
        del plain["bytes"], plain["sha256"]
        return {META_PREFIX + key: json.dumps(value) if key == "gaps" else str(value)
                for key, value in plain.items()}

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        raw: dict[str, Any] = json.loads(text)
        return cls(**{**raw, "gaps": [Gap(**gap) for gap in raw.get("gaps", [])]})


def conformed(table: pa.Table) -> pa.Table:
    """``table`` (rows of a segment of any version) with `SCHEMA`'s columns, in order: a
    column its segment's version did not have is null."""
    for name in ADDED:
        if name not in table.column_names:
            table = table.append_column(SCHEMA.field(name), pa.nulls(table.num_rows,
                                                                     SCHEMA.field(name).type))
    return table.select(SCHEMA.names).cast(SCHEMA)


def node_token(node: str) -> str:
    """The node's name in its segments' names."""
    return _UNSAFE.sub("_", node)


def segment_name(node: str, sequence: int) -> str:
    return f"ledger-{node_token(node)}-{sequence:012d}.parquet"


def manifest_path(segment: Path) -> Path:
    """The sidecar of ``segment``."""
    return segment.with_suffix(".json")


def sequence_of(path: Path) -> int | None:
    """The sequence number of a segment's (or an open segment's) path; None if it is not one."""
    name = path.name.removesuffix(".open")
    matched = SEGMENT.match(name)
    return None if matched is None else int(matched["sequence"])


def segments(folder: Path) -> list[Path]:
    """The closed segments in ``folder``, oldest (lowest sequence) first."""
    if not folder.is_dir():
        return []
    found = [path for path in folder.iterdir() if SEGMENT.match(path.name)]
    return sorted(found, key=lambda path: sequence_of(path) or 0)


def read_manifest(segment: Path) -> Manifest:
    """The sidecar manifest of a closed segment."""
    return Manifest.from_json(manifest_path(segment).read_text(encoding="utf-8"))
