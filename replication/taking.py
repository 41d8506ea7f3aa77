"""Taking a snapshot without holding the Raft thread: the state is named on it, in memory, and
made durable beside it.

A snapshot names every state file's length at its index (`state_files.Manifest`), and must
not be put in place before the bytes it names are in those files (and, with ``fsync``, on
disk): the journal is cut to it once it is. Taken in one Raft step, that was a flush of every
hour that had appends buffered (its log, index, tombstones and heads checkpoint), a ``stat``
of every file and, with ``fsync``, an fsync of every file that grew: 35-95 ms on a node of
1,200 files without ``fsync``, and more with it. Here the take goes in four parts:

1. *capture* (`Takes.begin`, the Raft step pysyncobj asks for a snapshot in): the manifest,
   its lengths read from memory (`Wheel.lengths`: what each file holds once its buffered
   appends are written), and the hours whose appends are still buffered;
2. *flush* (`Takes.advance`, each following Raft step): those hours written, for at most
   ``FLUSH_SLICE_S`` a step. Files only grow, so appends applied after the capture and
   written with them do no harm: the snapshot names a prefix;
3. *write* (a thread, ``snapshot-take``): with ``fsync``, the files that grew since their
   last sync and their folders synced; the snapshot written beside its place
   (``snapshot.taking``), and synced;
4. *put in place* (`Takes.advance`, on the Raft thread, where a snapshot received from the
   leader is put in place too): renamed over the snapshot (with ``fsync``, the folder synced),
   passed hours deleted (`StateMachine.snapshot_written`), and pysyncobj told it is done:
   only then does it cut its journal.

A stop at any point before the rename leaves the previous snapshot in place, with every file
it names (nothing is deleted before the rename), and the journal uncut. A snapshot received
from the leader meanwhile voids the take (`Takes.void`): its files are gone or about to be,
and its rename must not replace the leader's snapshot; the thread's work is then dropped.

Nothing on the thread changes the state: it syncs and writes files the Raft thread named. The
Raft thread owns everything else. Callers: `Snapshots` (which owns a `Takes`), and
`tickwheel.replication.raft.snapshot`'s serializer through the `Taking` port.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tickwheel.replication.raft import SyncLedger, fsync_files, write_snapshot
from tickwheel.replication.state import StateMachine
from tickwheel.replication.state_files import Manifest, manifest_parts

log = logging.getLogger("tickwheel.replication")

FLUSH_SLICE_S = 0.002
"""How long a Raft step flushes hours a snapshot names before it goes on (at least one)."""
TAKING_SUFFIX = ".taking"
"""The snapshot being written, beside the snapshot file, before its rename."""


@dataclass(slots=True)
class _Take:
    """One snapshot from its capture until it is in place."""

    path: str
    manifest: Manifest
    raft_tail: tuple[Any, ...]
    unflushed: list[int]
    """The hours whose buffered appends it names, still to be written."""
    flushed_hours: int
    in_place: bool
    """Written at ``path`` itself, by the caller's thread (`Takes.take`)."""
    began_s: float
    capture_ms: float
    flush_ms: float = 0.0
    """The Raft thread's time in the flush, over its steps."""
    flush_steps: int = 0
    longest_ms: float = 0.0
    """The longest of its parts on the Raft thread, each in a step of its own (the capture,
    a slice of the flush, putting it in place)."""
    writing: bool = False
    synced_files: int = 0
    write_ms: float = 0.0
    """The thread's time: syncing, writing the snapshot."""
    over: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None


class Takes:
    """The snapshots one node takes, one at a time, and what its state files hold on disk."""

    def __init__(self, state: StateMachine, state_root: Path, fsync: bool,
                 sync_ledger: SyncLedger | None) -> None:
        self._state = state
        self._state_root = state_root
        self._fsync = fsync
        self._sync_ledger = sync_ledger
        self._take: _Take | None = None
        self._thread: threading.Thread | None = None
        """The last take's writing thread (the next one waits for it: a voided take's thread
        may still be writing ``snapshot.taking``)."""
        self.synced: dict[str, int] = {}
        """With ``fsync``: each state file's length as of its last fsync."""
        self.wake: Callable[[], None] = lambda: None
        """Has the Raft thread step again at once (any thread): while hours are left to flush,
        and once the thread has written the snapshot. A follower with nothing to apply steps
        at its leader's heartbeats alone, a flush of 1,000 hours two at a time took it 20 s."""

    # -- the `Taking` port (the Raft thread) ------------------------------------------------

    def begin(self, path: str, raft_tail: tuple[Any, ...], in_place: bool = False) -> None:
        """Capture a snapshot of the state to be put at ``path`` (`advance` does the rest)."""
        started = time.monotonic()
        manifest = self._state.capture()
        unflushed = self._state.wheel.unflushed_hours()
        captured = time.monotonic()
        self._take = _Take(path, manifest, raft_tail, unflushed, len(unflushed), in_place,
                           started, (captured - started) * 1000)
        log.info("event=snapshot_take_begun files=%d unflushed_hours=%d capture_ms=%.1f",
                 len(manifest.files), len(unflushed), (captured - started) * 1000)

    def advance(self) -> bool | None:
        """Take the snapshot begun a step further: None while it is under way, True once it
        is in place, False if it failed (logged; pysyncobj tries again later)."""
        take = self._take
        if take is None:
            return False
        try:
            return self._advance(take)
        except Exception:  # as pysyncobj's own serializer: the take fails, the node goes on
            log.exception("event=snapshot_take_failed path=%s", take.path)
            self._take = None
            return False

    def void(self) -> None:
        """Drop the take under way (a snapshot received from the leader replaced the state it
        names); its thread's work is dropped."""
        if self._take is not None:
            log.info("event=snapshot_take_voided path=%s", self._take.path)
        self._take = None

    # -- for `Snapshots` ----------------------------------------------------------------------

    def take(self, path: str, raft_tail: tuple[Any, ...]) -> None:
        """Take a snapshot to ``path`` in this call (a node without the port: the
        simulation)."""
        self.begin(path, raft_tail, in_place=True)
        while self.advance() is None:
            pass

    def sync_named(self, files: dict[str, int], every: bool = False) -> None:
        """With ``fsync``, on the calling thread: the files ``files`` names that grew since
        their last sync (``every``: all of them), and their folders."""
        if self._fsync:
            fsync_files(self._with_folders(self._grown(files, every)), self._sync_ledger)
            self.synced = dict(files)

    # -- the parts ----------------------------------------------------------------------------

    def _advance(self, take: _Take) -> bool | None:
        if take.unflushed:
            self._flush_slice(take)
            if take.unflushed:
                self.wake()
                return None
        if not take.writing:
            take.writing = True
            names = self._grown(take.manifest.files, every=False) if self._fsync else []
            take.synced_files = len(names)
            if take.in_place:
                self._write(take, names, None)
            else:
                previous = self._thread
                self._thread = threading.Thread(target=self._write, args=(take, names, previous),
                                                name="snapshot-take", daemon=True)
                self._thread.start()
        if not take.over.is_set():
            return None
        self._take = None
        if take.error is not None:
            raise take.error
        self._put_in_place(take)
        return True

    def _flush_slice(self, take: _Take) -> None:
        """Write the buffered appends of the hours ``take`` names: one, then more for up to
        ``FLUSH_SLICE_S`` (all at once for a take in place)."""
        started = time.monotonic()
        ends = started + FLUSH_SLICE_S
        wheel = self._state.wheel
        wheel.flush_hour(take.unflushed.pop())
        while take.unflushed and (take.in_place or time.monotonic() < ends):
            wheel.flush_hour(take.unflushed.pop())
        slice_ms = (time.monotonic() - started) * 1000
        take.flush_ms += slice_ms
        take.flush_steps += 1
        take.longest_ms = max(take.longest_ms, slice_ms)

    def _write(self, take: _Take, names: list[str], previous: threading.Thread | None) -> None:
        """The thread's part: sync the files ``names`` names and their folders, write the
        snapshot beside its place (at it, in place), sync it."""
        try:
            if previous is not None:
                previous.join()
            started = time.monotonic()
            fsync_files(self._with_folders(names), self._sync_ledger)
            target = take.path if take.in_place else take.path + TAKING_SUFFIX
            write_snapshot(target, manifest_parts(take.manifest), take.raft_tail,
                           self._fsync, self._sync_ledger)
            take.write_ms = (time.monotonic() - started) * 1000
        except Exception as error:  # reported on the Raft thread
            take.error = error
        finally:
            take.over.set()
            self.wake()

    def _put_in_place(self, take: _Take) -> None:
        """Rename the snapshot written into place, then forget what it made unneeded."""
        started = time.monotonic()
        if not take.in_place:
            os.replace(take.path + TAKING_SUFFIX, take.path)
            if self._fsync:
                fsync_files([Path(take.path).parent], self._sync_ledger)
        if self._fsync:
            self.synced = dict(take.manifest.files)
        self._state.snapshot_written(take.manifest)
        ended = time.monotonic()
        in_place_ms = (ended - started) * 1000
        log.info("event=snapshot_taken files=%d flushed_hours=%d synced_files=%d "
                 "cursor_second=%d cursor_local_index=%d capture_ms=%.1f flush_ms=%.1f "
                 "flush_steps=%d write_ms=%.1f in_place_ms=%.1f longest_step_ms=%.1f "
                 "duration_ms=%.1f", len(take.manifest.files), take.flushed_hours,
                 take.synced_files, *take.manifest.cursor, take.capture_ms, take.flush_ms,
                 take.flush_steps, take.write_ms, in_place_ms,
                 max(take.capture_ms, take.longest_ms, in_place_ms),
                 (ended - take.began_s) * 1000)

    def _grown(self, files: dict[str, int], every: bool) -> list[str]:
        """The files ``files`` names that grew since their last sync (or every one). The
        files only grow, so the rest are on disk already: fsyncing every one, hundreds once a
        cluster holds many hours, held the Raft thread for 235-346 ms (when takes synced
        on it)."""
        synced = self.synced
        return sorted(name for name, size in files.items()
                      if every or synced.get(name, -1) < size)

    def _with_folders(self, names: list[str]) -> list[Path]:
        """The state files ``names`` names and the folders that hold them, deepest first (a
        file created since the last snapshot, a new hour, is lost to a power cut without its
        entry)."""
        root = self._state_root
        paths = [root / name for name in names]
        folders = {folder for path in paths for folder in path.parents
                   if folder == root or root in folder.parents}
        return [*paths, *sorted(folders, key=lambda f: len(f.parts), reverse=True)]
