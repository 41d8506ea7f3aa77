"""The ledger's writer: a bounded buffer that any thread adds rows to without waiting, and
one thread (``tickwheel-ledger``) that writes them as Parquet segments.

`Ledger.add` is all the Raft thread and the courier ever call: it stamps the rows with this
node's clock and appends them, as the columns they came in, to a buffer of at most
``max_buffer_rows`` rows. A full buffer (or a ledger closing) drops the rows and counts them
(``tickwheel_ledger_dropped_rows{reason="buffer_full"}``) as a *gap* that the next segment's
metadata records (`tickwheel.node.ledger.schema.Gap`): delivery never waits on the disk nor
on Parquet encoding.

The writer thread takes everything buffered every ``flush_ms`` (at once when `FLUSH_ROWS` are
waiting), joins the columns into one Arrow table (`tickwheel.node.ledger.columns`)
and writes it as one row group (zstd, with page checksums) of the open segment. A segment
is closed when it reaches ``max_segment_bytes`` or is ``max_segment_age_ms`` old: its footer
gets the manifest's key-value metadata, a sidecar manifest gets its size and SHA-256, its index
is written (`tickwheel.node.ledger.index`), and only then does it take its final name, so a
closed segment is always whole; the gaps recorded until then go into its manifest. Then
retention runs (`tickwheel.node.ledger.retention`).

A node killed (SIGKILL, an OOM kill, a crash) loses every row it had not closed into a
segment: those of its open segment and those still buffered (at most ``max_segment_age_ms``
plus ``flush_ms``), and the gaps not yet in a manifest. Keeping them would cost every row a
second write (docs/benchmarks.md, "The ledger's writer"), so the next start accounts for them
instead: `RUNNING` is written when the ledger opens and deleted once `close` has recorded
everything, so finding it (or a torn ``.open`` segment, which is deleted) means a kill, and
the next start records one ``torn_segment`` gap from the last row of the newest closed segment
(or, if that is older, the killed run's start) to its own start, naming the torn segment's
sequence, in a segment of its own closed at once (so a second kill cannot lose it).

Owned by `tickwheel.node.serve`, which hands it to the replica and the courier as their
`LedgerSink`; `close` writes what is buffered and closes the segment.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

import pyarrow as pa
import pyarrow.parquet as pq

from tickwheel.node.ledger import retention as kept
from tickwheel.node.ledger.columns import ledger_table
from tickwheel.node.ledger.index import INDEX_SUFFIX, index_path, segment_of_index, write_index
from tickwheel.node.ledger.metrics import LedgerMetrics
from tickwheel.node.ledger.schema import (
    FORMAT_VERSION,
    SCHEMA,
    WRITE_OPTIONS,
    Gap,
    Manifest,
    manifest_path,
    read_manifest,
    segment_name,
    segments,
    sequence_of,
)
from tickwheel.node.ops.disk import DEFAULT_RESERVE_BYTES, free_bytes
from tickwheel.replication import LedgerRows

log = logging.getLogger("tickwheel.node.ledger")

RUNNING: Final = "running.json"
"""In the ledger's folder while a ledger is open: ``{"started_ms": ...}``, the node's clock
when it opened."""
FLUSH_ROWS: Final = 65_536
"""Buffered rows that wake the writer before its ``flush_ms``: a row group's size."""


@dataclass(frozen=True, slots=True)
class LedgerConfig:
    """The node's ledger settings (``ledger_*``, docs/node.md)."""

    max_segment_bytes: int = 64 << 20
    max_segment_age_ms: int = 60_000
    max_buffer_rows: int = 500_000
    max_age_s: int = 7 * 86_400
    max_bytes: int = 1 << 30
    reserve_bytes: int = DEFAULT_RESERVE_BYTES
    flush_ms: int = 1_000


@dataclass(slots=True)
class _Segment:
    """The segment being written."""

    sequence: int
    path: Path
    sink: pa.NativeFile
    writer: pq.ParquetWriter
    opened_ms: int
    gaps: list[Gap]
    rows: int = 0
    first_ms: int = 0
    last_ms: int = 0
    cut_ms: int = 0
    """When the writer took the last rows written to it: every row stamped before is in it, an
    earlier segment or a gap (`add` stamps under the lock the take holds)."""


class Ledger:
    """A node's ledger in ``folder``. `start` it; `add` from any thread; `close` at the end."""

    def __init__(self, folder: Path, node: str, config: LedgerConfig, clock_ms: Callable[[], int],
                 metrics: LedgerMetrics | None = None,
                 measure_free: kept.FreeBytes = free_bytes) -> None:
        self.folder = folder
        self._node = node
        self._config = config
        self._clock_ms = clock_ms
        self._metrics = metrics or LedgerMetrics()
        self._retention = kept.Retention(config.max_age_s, config.max_bytes, config.reserve_bytes,
                                         config.max_segment_bytes, measure_free)
        self._cond = threading.Condition()
        self._queue: list[tuple[int, LedgerRows]] = []
        self._buffered = 0
        self._wrote = False
        """Rows were written since the start: a stop then closes a segment even if none is
        open, so that its manifest says the node recorded everything until it stopped."""
        self._lost: dict[str, Gap] = {}
        """Gaps not yet in a segment, by reason (torn and failed segments by sequence)."""
        self._stopping = False
        self._rotations = 0
        self._rotate_asked = 0
        self._segment: _Segment | None = None
        folder.mkdir(parents=True, exist_ok=True)
        self._next_sequence = self._recover()
        self._mark_running()
        self._thread = threading.Thread(target=self._run, name="tickwheel-ledger", daemon=True)

    # -- any thread -------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def add(self, rows: LedgerRows) -> None:
        """Buffer ``rows``, or drop and count them if the buffer is full; never waits."""
        count = rows.size
        if not count:
            return
        with self._cond:
            stamp_ms = self._clock_ms()
            if self._stopping or self._buffered + count > self._config.max_buffer_rows:
                self._lose("buffer_full", count, stamp_ms, stamp_ms)
                return
            self._queue.append((stamp_ms, rows))
            self._buffered += count
            if self._buffered >= FLUSH_ROWS:
                self._cond.notify()

    def rotate(self) -> None:
        """Write what is buffered and close the open segment; returns once it is closed (for
        tests and for collecting a running node's ledger)."""
        with self._cond:
            self._rotate_asked += 1
            asked = self._rotate_asked
            self._cond.notify()
            self._cond.wait_for(lambda: self._rotations >= asked or not self._thread.is_alive())

    def close(self) -> None:
        """Write what is buffered, close the segment (an empty one if only gaps are left to
        record), and stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()
        else:
            self._finish()
        with self._cond:
            recorded = not self._lost
        if recorded:  # else the next start records a gap over what this one could not
            (self.folder / RUNNING).unlink(missing_ok=True)

    # -- the writer thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._stopping and self._rotate_asked == self._rotations:
                    self._cond.wait(self._wait_s())
                taken, cut_ms = self._take_queue()
                stopping, asked = self._stopping, self._rotate_asked
            self._took(taken, cut_ms)
            if stopping:
                self._finish()
                return
            segment = self._segment
            if asked != self._rotations or (segment is not None and self._clock_ms()
                                            - segment.opened_ms >= self._config.max_segment_age_ms):
                self._close_segment()
            with self._cond:
                self._rotations = asked
                self._cond.notify_all()

    def _wait_s(self) -> float:
        wait_ms = min(self._config.flush_ms, self._config.max_segment_age_ms)
        if self._segment is not None:
            age_ms = self._clock_ms() - self._segment.opened_ms
            wait_ms = min(wait_ms, self._config.max_segment_age_ms - age_ms)
        return max(wait_ms, 1) / 1000

    def _finish(self) -> None:
        with self._cond:
            taken, cut_ms = self._take_queue()
        self._took(taken, cut_ms)
        if self._segment is None and (self._lost or self._wrote):
            self._open()  # an empty segment: the gaps, and until when all was written
        if self._segment is not None:
            self._segment.cut_ms = cut_ms  # all before it written, or in its gaps
        self._close_segment()
        with self._cond:
            self._rotations = self._rotate_asked
            self._cond.notify_all()

    def _take_queue(self) -> tuple[list[tuple[int, LedgerRows]], int]:
        """What is buffered, and the time taken (with the lock held): every row stamped
        before it is in what was taken or earlier, as `add` stamps under the lock."""
        taken, self._queue, self._buffered = self._queue, [], 0
        return taken, self._clock_ms()

    def _took(self, taken: list[tuple[int, LedgerRows]], cut_ms: int) -> None:
        """Write what was taken at ``cut_ms``; taking nothing says the open segment holds
        every row stamped before it too."""
        if taken:
            self._write(taken, cut_ms)
        elif self._segment is not None:
            self._segment.cut_ms = cut_ms

    def _write(self, taken: list[tuple[int, LedgerRows]], cut_ms: int) -> None:
        table = ledger_table(taken, self._node)
        first_ms, last_ms = taken[0][0], taken[-1][0]
        if self._segment is None and not self._open():
            self._lose("disk_low", table.num_rows, first_ms, last_ms)
            return
        segment = self._segment
        assert segment is not None
        try:
            if not kept.room_for_segment(self.folder, self._retention):
                self._close_segment()
                self._lose("disk_low", table.num_rows, first_ms, last_ms)
                return
            segment.writer.write_table(table)
        except (OSError, pa.ArrowException) as error:
            log.error("event=ledger_write_failed path=%s error=%r", segment.path, error)
            self._abandon(segment)
            self._lose("write_failed", table.num_rows, first_ms, last_ms)
            return
        segment.first_ms = segment.first_ms or first_ms
        segment.last_ms = last_ms
        segment.cut_ms = cut_ms
        self._wrote = True
        segment.rows += table.num_rows
        self._metrics.rows.inc(table.num_rows)
        if segment.sink.tell() >= self._config.max_segment_bytes:
            self._close_segment()

    def _open(self) -> bool:
        """Begin the next segment; False (none begun) while the disk has no room for it."""
        if not kept.room_for_segment(self.folder, self._retention):
            return False
        sequence = self._next_sequence
        path = self.folder / (segment_name(self._node, sequence) + ".open")
        try:
            sink = pa.OSFile(str(path), "wb")
            writer = pq.ParquetWriter(sink, SCHEMA, **WRITE_OPTIONS)
        except (OSError, pa.ArrowException) as error:
            log.error("event=ledger_open_failed path=%s error=%r", path, error)
            return False
        self._next_sequence += 1
        with self._cond:
            gaps, self._lost = list(self._lost.values()), {}
        self._segment = _Segment(sequence, path, sink, writer, self._clock_ms(), gaps)
        return True

    def _close_segment(self) -> None:
        segment, self._segment = self._segment, None
        if segment is None:
            return
        with self._cond:
            segment.gaps += self._lost.values()
            self._lost = {}
        manifest = Manifest(FORMAT_VERSION, self._node, segment.sequence, segment.rows,
                            segment.first_ms or segment.opened_ms,
                            segment.last_ms or segment.opened_ms, segment.opened_ms,
                            self._clock_ms(), segment.gaps,
                            complete_ms=segment.cut_ms or segment.last_ms or segment.opened_ms)
        final = segment.path.with_name(segment.path.name.removesuffix(".open"))
        try:
            segment.writer.add_key_value_metadata(manifest.metadata())
            segment.writer.close()
            segment.sink.close()
            data = segment.path.read_bytes()
            manifest = replace(manifest, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
            _write_index(segment.path, final, manifest.sha256)
            _write_atomically(manifest_path(final), manifest.to_json())
            os.replace(segment.path, final)
        except (OSError, pa.ArrowException) as error:
            log.error("event=ledger_close_failed path=%s error=%r", segment.path, error)
            self._abandon(segment)
            self._lose("write_failed", segment.rows, segment.first_ms, segment.last_ms)
            return
        self._metrics.segments.inc()
        log.info("event=ledger_segment_closed path=%s rows=%d bytes=%d gaps=%d", final,
                 manifest.rows, manifest.bytes, len(manifest.gaps))
        self._enforce_retention()

    def _abandon(self, segment: _Segment) -> None:
        """Give up a segment that could not be written: its gaps go to the next one."""
        self._segment = None
        try:
            segment.sink.close()
            os.unlink(segment.path)
        except OSError:
            pass
        with self._cond:
            for gap in segment.gaps:
                self._lost.setdefault(f"{gap.reason}:{gap.sequence}", gap)

    def _enforce_retention(self) -> None:
        deleted, total_bytes = kept.enforce(self.folder, self._retention, self._clock_ms())
        for _, reason in deleted:
            self._metrics.deleted.labels(reason).inc()
        self._metrics.bytes.set(total_bytes)

    def _lose(self, reason: str, rows: int, first_ms: int, last_ms: int) -> None:
        """Count rows that no segment will hold, as a gap for the segment being written, else
        the next one begun (any thread: the condition's lock is reentrant)."""
        with self._cond:
            gap = self._lost.get(reason)
            self._lost[reason] = (Gap(reason, rows, first_ms, last_ms) if gap is None else
                                  replace(gap, rows=(gap.rows or 0) + rows, last_ms=last_ms))
        self._metrics.dropped.labels(reason).inc(rows)

    def _recover(self) -> int:
        """At start: delete the segments a crash left open (torn), and stray manifests and
        indexes; record what a kill lost (`_record_kill`); returns the next sequence number."""
        highest = 0
        torn: list[int] = []
        for path in list(self.folder.iterdir()):
            sequence = sequence_of(path)
            if sequence is None:
                continue
            highest = max(highest, sequence)
            if path.name.endswith(".open"):
                os.unlink(path)
                torn.append(sequence)
                log.warning("event=ledger_segment_torn path=%s", path)
        for path in self.folder.glob("ledger-*.json"):
            if not path.with_suffix(".parquet").exists():
                os.unlink(path)
        for path in self.folder.glob(f"ledger-*{INDEX_SUFFIX}*"):
            if not path.name.endswith(INDEX_SUFFIX) or not segment_of_index(path).exists():
                os.unlink(path)
        self._enforce_retention()
        self._next_sequence = highest + 1
        self._record_kill(sorted(torn))
        return self._next_sequence

    def _record_kill(self, torn: list[int]) -> None:
        """If the ledger before this one was not closed (`RUNNING` is left, or a segment was
        torn), record the ``torn_segment`` gap of the module docstring, one per torn segment
        (one without a sequence if none was open), in a segment closed at once."""
        started_ms = _started_ms(self.folder / RUNNING)
        if started_ms is None and not torn:
            return
        kept = segments(self.folder)
        last_ms = _last_row_ms(kept[-1]) if kept else None
        edges = [ms for ms in (started_ms, last_ms) if ms is not None]
        first_ms = max(edges) if edges else None
        now_ms = self._clock_ms()
        named: list[int | None] = [*torn] or [None]
        for sequence in named:
            self._lost[f"torn:{sequence}"] = Gap("torn_segment", None, first_ms, now_ms,
                                                 sequence)
        log.warning("event=ledger_killed from_ms=%s to_ms=%d torn=%s", first_ms, now_ms,
                    torn or "-")
        if self._open():
            self._close_segment()

    def _mark_running(self) -> None:
        """Write `RUNNING` with this start's time, unless gaps are still unrecorded (the disk
        was too low to record a kill's): the older start then stays the gap's edge."""
        marker = self.folder / RUNNING
        if self._lost and marker.exists():
            return
        _write_atomically(marker, json.dumps({"started_ms": self._clock_ms()}))


def _started_ms(marker: Path) -> int | None:
    """The ``started_ms`` of a `RUNNING` file; None if there is none (a clean stop). One
    that cannot be read still means a kill: its edge is then the newest segment's."""
    try:
        raw = json.loads(marker.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return 0
    started = raw.get("started_ms") if isinstance(raw, dict) else None
    return started if isinstance(started, int) else 0


def _last_row_ms(segment: Path) -> int | None:
    """The ``node_ms`` of a closed segment's last row (its manifest's ``last_ms``)."""
    try:
        return read_manifest(segment).last_ms
    except (OSError, ValueError, TypeError):
        return None


def _write_index(written: Path, final: Path, sha256: str) -> None:
    """The index of the segment just written (`tickwheel.node.ledger.index`); a segment
    whose index cannot be written is kept without one (a trace builds it)."""
    try:
        write_index(written, index_path(final), sha256)
    except (OSError, pa.ArrowException) as error:
        log.error("event=ledger_index_failed path=%s error=%r", final, error)


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)
