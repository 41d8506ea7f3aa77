"""The state machine's side of Raft's snapshots: taking one, installing one, the state files
they name, and the peers' copies of those files.

A snapshot holds no bodies: it names the state files' lengths (`StateMachine.manifest`), and
a node installing a leader's snapshot fetches the bytes it lacks from its peers, leader first:
off the Raft thread, into a folder beside its state (`Snapshots.prefetch`,
`tickwheel.replication.staging`), which the install then switches to. Damaged bytes of this
node's own files are mended from the peers' copies too (`tickwheel.wheel.mending`). On the
Raft thread, but for `read_state_file` and the fetching thread.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tenacity import (
    RetryCallState,
    retry,
    retry_if_result,
    stop_after_delay,
    wait_random_exponential,
)

from tickwheel.common.clock import Clock
from tickwheel.common.errors import (
    CorruptSegment,
    InvariantViolation,
    StorageIncomplete,
)
from tickwheel.common.exits import EXIT_FATAL, EXIT_SNAPSHOT_UNREADABLE, EXIT_STATE_UNREADABLE
from tickwheel.replication import staging
from tickwheel.replication.dedupe import DedupeWindow
from tickwheel.replication.exits import Die
from tickwheel.replication.raft import (
    JOURNAL_FILE,
    SNAPSHOT_FILE,
    RaftConfig,
    SnapshotDamaged,
    SyncLedger,
    fsync_files,
    journal_first_index,
    read_snapshot,
)
from tickwheel.replication.state import StateMachine
from tickwheel.replication.state_files import Manifest, manifest_of
from tickwheel.replication.taking import Takes
from tickwheel.wheel import Wheel

log = logging.getLogger("tickwheel.replication")

PeerFetch = Callable[[list[str], str, int, int], bytes]
"""``fetch(peers, path, offset, size)``: bytes of a state file from the first of ``peers`` (Raft
addresses, leader first) that has them. The node provides it (over gRPC)."""
PeerFetchMany = Callable[[list[str], list[tuple[str, int, int]]], list[bytes]]
"""``fetch_many(peers, ranges)``: the bytes of each ``(path, offset, size)`` range of state
files, in one call to the first of ``peers`` that has them all (`PeerFetch`, batched)."""
PeerCopies = Callable[[list[str], str, int, int], Iterator[bytes | None]]
"""``copies(peers, path, offset, size)``: what each of ``peers`` holds of a state file there,
asked once, in the order they answer (None for a peer that cannot answer now): where damaged
bytes of this node's wheel are mended from (`tickwheel.wheel.mending`)."""
MEND_PATIENCE_S = 30.0
"""How long a node that does not lead keeps asking for a copy of damaged bytes while no peer
can answer (they may be starting too) before it gives up and stops (exit 5,
`EXIT_STATE_UNREADABLE`)."""


def starts_fresh(data_dir: Path) -> bool:
    """Whether the node has no snapshot yet; `StorageIncomplete` if its journal needs one.
    First puts right what an install stopped midway left (`staging.tidy`)."""
    staging.tidy(data_dir / "state")
    raft_dir = data_dir / "raft"
    fresh = not (raft_dir / SNAPSHOT_FILE).exists()
    first_entry = journal_first_index(raft_dir / JOURNAL_FILE)
    if fresh and first_entry is not None and first_entry > 1:
        raise StorageIncomplete(
            f"{raft_dir / 'snapshot'} is missing, but the Raft journal starts at entry "
            f"{first_entry}: entries 1 to {first_entry - 1} were only in that snapshot, and "
            "without them this node would serve, vote and lead on a partial state. Restore "
            f"the snapshot, or move {data_dir} away: the node then starts empty and "
            "catches up from the leader (do that only while a majority of the other members "
            "has its data)")
    return fresh


def _last_result(state: RetryCallState) -> list[bytes | None]:
    if state.outcome is None:
        raise InvariantViolation("tenacity gave up before any attempt")
    answers: list[bytes | None] = state.outcome.result()
    return answers


@retry(retry=retry_if_result(lambda answers: bool(answers) and all(a is None for a in answers)),
       wait=wait_random_exponential(multiplier=0.1, max=2.0),
       stop=stop_after_delay(MEND_PATIENCE_S), retry_error_callback=_last_result)
def _patiently(ask: Callable[[], list[bytes | None]]) -> list[bytes | None]:
    """``ask()`` again while it asks someone and nobody answers (the last answers once out of
    patience)."""
    return ask()


class PeerFiles:
    """The peers' state files, asked leader first."""

    def __init__(self, peers: Sequence[str], fetch: PeerFetch,
                 leader_hint: Callable[[], str | None], leading: Callable[[], bool],
                 fetch_many: PeerFetchMany | None = None) -> None:
        self._peers = tuple(peers)
        self._fetch = fetch
        self._fetch_many = fetch_many
        self._leader_hint = leader_hint
        self._leading = leading

    def fetch(self, path: str, offset: int, size: int) -> bytes:
        return self._fetch(self._leader_first(), path, offset, size)

    @property
    def fetch_many(self) -> Callable[[list[tuple[str, int, int]]], list[bytes]] | None:
        """The batched `fetch`, if the node provides one."""
        batched = self._fetch_many
        if batched is None:
            return None
        return lambda ranges: batched(self._leader_first(), ranges)

    def copies(self, copies: PeerCopies, path: str, offset: int, size: int
               ) -> Iterable[bytes | None]:
        """The peers' copies, asked once on the leader (its dispatch holds, and asks again
        later); a node that does not lead cannot go on applying without the bytes, so it asks
        again while no peer can answer, for up to ``MEND_PATIENCE_S``."""
        if self._leading():
            return copies(self._leader_first(), path, offset, size)
        return _patiently(lambda: list(copies(self._leader_first(), path, offset, size)))

    def _leader_first(self) -> list[str]:
        leader = self._leader_hint()
        return sorted(self._peers, key=lambda peer: peer != leader)


class _Fetching:
    """A leader's snapshot whose files the fetching thread gathers (`Snapshots.prefetch`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.over = threading.Event()
        self.folder: Path | None = None
        self.fetched_bytes = 0
        self.opened: tuple[Wheel, DedupeWindow] | None = None
        self.error: Exception | None = None


class Snapshots:
    def __init__(self, address: str, data_dir: Path, state: StateMachine, peers: PeerFiles,
                 config: RaftConfig, clock: Clock, die: Die) -> None:
        self._address = address
        self._die = die
        self._data_dir = data_dir
        self._state = state
        self._peers = peers
        self._config = config
        self._clock = clock
        self._sync_ledger = None if config.sync_ledger is None else SyncLedger(config.sync_ledger)
        self.takes = Takes(state, data_dir / "state", config.fsync, self._sync_ledger)
        """The snapshots this node takes (`tickwheel.replication.taking`)."""
        self._fetching: _Fetching | None = None
        """The leader's snapshot whose files are being gathered (`prefetch`), until installed."""
        self._retiring: threading.Thread | None = None
        """Deletes the state folder the last install replaced."""
        self._installed_own: tuple[str, int, tuple[Any, ...], float] | None = None
        """This node's own snapshot, installed before the Raft thread's first tick
        (`install_own`): its path, inode, Raft's part and how long the install took."""

    def install_own(self) -> None:
        """Install this node's own snapshot, if it has one, before the Raft thread's first
        tick, in which pysyncobj would (its deserializer then finds it done). Cutting,
        deleting and fetching its files, opening the wheel and, with ``fsync``, syncing every
        file it names took that tick 35-98 ms without ``fsync`` and seconds with it: the
        node's Raft port was open (pysyncobj opens it earlier in the same tick) and
        answered nothing meanwhile. Before the first tick it is not open yet."""
        path = self._data_dir / "raft" / SNAPSHOT_FILE
        if path.exists():
            inode = os.stat(path).st_ino
            self._installed_own = (str(path), inode, *self.install(str(path)))

    def take(self, path: str, raft_tail: tuple[Any, ...]) -> None:
        """Write a snapshot of the state to ``path``, with Raft's own part, in this call (a
        node that takes them off the Raft thread goes through `takes`, the `Taking` port)."""
        self.takes.take(path, raft_tail)

    def install(self, path: str) -> tuple[tuple[Any, ...], float]:
        """Install a snapshot: this node's own at start, or one a leader sent; returns Raft's
        part of it and how long the install took. pysyncobj logs and ignores whatever this
        raises (then serves on state the snapshot did not set, applying nothing, since its
        journal begins after entries it never applied), so a snapshot that cannot be read
        or whose manifest this build cannot make (a newer release's) stops the process here
        (`EXIT_SNAPSHOT_UNREADABLE`)."""
        own, self._installed_own = self._installed_own, None
        if own is not None and own[0] == path and os.stat(path).st_ino == own[1]:
            return own[2], own[3]  # installed before the first tick: the same file
        try:
            parts, raft_tail = read_snapshot(path)
            manifest = manifest_of(parts)
        except Exception as error:  # any failure to read it: the snapshot is not for us
            reason = "snapshot_damaged" if isinstance(error, SnapshotDamaged | OSError) else (
                "snapshot_unreadable")
            log.critical("event=node_refused reason=%s path=%s %s. Restore the snapshot, run "
                         "the release that wrote it, or move %s away: the node then starts "
                         "empty and catches up from the leader (do that only while a majority "
                         "of the other members has its data)", reason, path,
                         error if reason == "snapshot_damaged" else repr(error),
                         self._data_dir)
            self._die(self._address, f"{reason}: {error!r}", EXIT_SNAPSHOT_UNREADABLE)
        started = self._clock.monotonic_s()
        fetching, self._fetching = self._fetching, None
        self.takes.void()  # the state it named is replaced
        try:
            if fetching is None:  # a restart's own snapshot: cut, delete, fetch here
                self._state.install(manifest, self._peers.fetch, self._peers.fetch_many)
            else:
                self._switch(manifest, fetching)
        except Exception as error:
            log.exception("event=snapshot_install_failed")
            self._die(self._address, f"snapshot install failed: {error!r}",
                      EXIT_STATE_UNREADABLE if isinstance(error, CorruptSegment | OSError)
                      else EXIT_FATAL)
        if fetching is None:
            # the files it names are on disk before pysyncobj clears the journal it replaces
            # (fetched, or already here but written since this node's last sync: both are
            # lost to a power cut, and the peers may have moved on)
            self.takes.sync_named(manifest.files, every=True)  # cut and fetched
        else:
            self.takes.synced = dict(manifest.files)  # synced when staged (`_gather`)
        return raft_tail, self._clock.monotonic_s() - started

    def prefetch(self, path: str, done: Callable[[], None]) -> None:
        """Begin to install the leader's snapshot at ``path``, whole: flush the state (nothing
        is applied until the install) and gather the files it names beside it, and open them,
        on a thread of its own (`staging.stage`), which calls ``done`` when it is over,
        fetched or not. Then pysyncobj loads the snapshot, and `install` switches to them."""
        self._state.flush()
        fetching = self._fetching = _Fetching(path)
        threading.Thread(target=self._gather, args=(fetching, done), daemon=True,
                         name="snapshot-fetch").start()

    def prefetched(self) -> bool:
        """Whether the files of the snapshot `prefetch` was given are gathered (or could not
        be: installing it then stops the node)."""
        return self._fetching is not None and self._fetching.over.is_set()

    def _gather(self, fetching: _Fetching, done: Callable[[], None]) -> None:
        """The fetching thread: `staging.stage` the files of the snapshot (with ``fsync``:
        synced, with their folders) and open them, before the switch makes them the state."""
        started = self._clock.monotonic_s()
        try:
            manifest = manifest_of(read_snapshot(fetching.path)[0])
            if self._retiring is not None:
                self._retiring.join()
            fetching.folder, fetching.fetched_bytes = staging.stage(
                self._data_dir / "state", manifest.files, self._peers.fetch,
                self._peers.fetch_many)
            if self._config.fsync:
                fsync_files(staging.staged_paths(fetching.folder, manifest.files),
                            self._sync_ledger)
            fetching.opened = self._state.open_files(fetching.folder)
            log.info("event=snapshot_fetched files=%d fetched_bytes=%d duration_ms=%.1f",
                     len(manifest.files), fetching.fetched_bytes,
                     (self._clock.monotonic_s() - started) * 1000)
        except Exception as error:  # the install reports it, on the Raft thread
            fetching.error = error
        finally:
            fetching.over.set()
            done()

    def _switch(self, manifest: Manifest, fetching: _Fetching) -> None:
        """Make the generation gathered (and opened) the state, on the Raft thread: the files
        before are closed first (their last flush must not land in the new ones)."""
        started_s = time.monotonic()  # as `StateMachine.install` counts
        folder, opened = fetching.folder, fetching.opened
        if fetching.error is not None:
            raise fetching.error
        if folder is None or opened is None:
            raise InvariantViolation("a snapshot's files gathered without a folder")
        self._state.close()
        before = staging.switch(self._data_dir / "state", folder)
        if self._config.fsync:
            fsync_files([self._data_dir], self._sync_ledger)
        self._state.take_over(manifest, opened, fetching.fetched_bytes, started_s)
        self._retiring = threading.Thread(target=shutil.rmtree, args=(before, True),
                                          name="snapshot-retire", daemon=True)
        self._retiring.start()

    def read_state_file(self, path: str, offset: int, size: int) -> bytes:
        """Bytes of a state file, for a peer installing a snapshot (any thread). State files
        only grow, and a snapshot only names lengths already written, so no lock is needed."""
        root = (self._data_dir / "state").resolve()
        target = (root / path).resolve()
        if root not in target.parents:
            raise ValueError(f"{path!r} is not a state file")
        with open(target, "rb") as file:
            return os.pread(file.fileno(), size, offset)
