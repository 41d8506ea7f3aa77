"""The state's files on disk, and what a snapshot says of them.

Every state file is append-only, so a `Manifest` lists each file's *length*, never its bytes.
Restoring one cuts every file back to its listed length (a restart: the journal replays what
came after), deletes what it does not name, and fetches the missing tail of each file from a
peer (a follower that fell behind the log, or was wiped).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from pyroaring import BitMap

from tickwheel.common.errors import invariant
from tickwheel.common.versions import BASELINE, SHARD_MAP_VERSION
from tickwheel.replication.groups import Snapshot as GroupsSnapshot
from tickwheel.replication.pending import Snapshot as PendingSnapshot
from tickwheel.wheel import Cursor
from tickwheel.wheel.fileio import APPEND_ONLY_FILES
from tickwheel.wheel.mending import CopySource

WHEEL = "wheel"
DEDUPE = "dedupe"
"""The folders of the wheel's and the dedupe window's files, under the state's root."""
FETCH_CHUNK_BYTES = 4 << 20
FETCH_PARALLEL = 8
"""How many fetches a restore has under way at once. One at a time, each fetch waited its turn
of a busy leader's event loop, 7-13 ms a file: a wiped follower of a chaos run took 8-10 s for
770 files (3 MB), its Raft thread blocked meanwhile; 8 at a time, 3.7-4.3 s."""
FETCH_BATCH_FILES = 256
"""How many files' missing tails one batched fetch (`FetchMany`) asks for, at most
``FETCH_CHUNK_BYTES`` in all."""

Fetch = Callable[[str, int, int], bytes]
"""``fetch(path, offset, size)``: bytes ``[offset, offset + size)`` of a state file, from a peer."""
FetchMany = Callable[[list[tuple[str, int, int]]], list[bytes]]
"""``fetch_many(ranges)``: the bytes of each ``(path, offset, size)`` range, in order, from a
peer, in one call (each range of a different file)."""
Range = tuple[str, int, int]


class ShardMapRecord(NamedTuple):
    """The shard map a ``shard_map`` command set: its version, the stamp of the command (when
    this shard began to take only the messages it gives it) and its description."""

    version: int
    stamp_ms: int
    body: bytes


@dataclass(frozen=True, slots=True)
class Manifest:
    """A snapshot: the lengths of every state file, the cursor, the stamp, the pending
    counts, the consumer groups and the positions readied past the cursor."""

    cursor: Cursor
    stamp_ms: int
    files: dict[str, int]
    pending: PendingSnapshot
    groups: GroupsSnapshot = (1, [], {})
    readied: dict[int, BitMap] = field(default_factory=dict)
    handle_key: bytes | None = None
    moves: dict[int, int] = field(default_factory=dict)
    shard_map: ShardMapRecord | None = None
    cluster_version: int = BASELINE
    """The formats the cluster writes (`tickwheel.common.versions`); a snapshot of a release
    before cluster versions has none, and is of `BASELINE`."""


def manifest_parts(manifest: Manifest) -> tuple[Any, ...]:
    """The manifest as a snapshot pickles it: plain tuples, dicts and bytes (the readied
    positions of a second as a tuple of ints, which 0.0.4, which kept sets, reads as it read
    them). Below `SHARD_MAP_VERSION` the eight parts 0.0.4 reads: its ``Manifest`` takes no
    more, and a follower of 0.0.4 is sent this file by an upgraded leader; the shard map and
    the cluster version follow from that version on."""
    parts = (tuple(manifest.cursor), manifest.stamp_ms, manifest.files, manifest.pending,
             manifest.groups,
             {second: tuple(indexes) for second, indexes in manifest.readied.items()},
             manifest.handle_key, manifest.moves)
    if manifest.cluster_version < SHARD_MAP_VERSION:
        invariant(manifest.shard_map is None, "a shard map set at cluster version "
                  f"{manifest.cluster_version}: shard_map commands are written from version "
                  f"{SHARD_MAP_VERSION} on")
        return parts
    return (*parts, None if manifest.shard_map is None else tuple(manifest.shard_map),
            manifest.cluster_version)


def manifest_of(parts: tuple[Any, ...]) -> Manifest:
    """`manifest_parts` read back; a snapshot of an older release has fewer parts, and its
    readied positions as sets."""
    cursor, stamp_ms, files, pending, *rest = parts
    if len(rest) >= 2:
        rest[1] = {second: BitMap(indexes) for second, indexes in rest[1].items()}
    if len(rest) >= 5 and rest[4] is not None:
        rest[4] = ShardMapRecord(*rest[4])
    return Manifest(Cursor(*cursor), stamp_ms, files, pending, *rest)


def restore_files(root: Path, files: dict[str, int], fetch: Fetch,
                  fetch_many: FetchMany | None = None) -> int:
    """Make the files under ``root`` exactly ``files``: cut what is longer, delete what it
    does not name, fetch what is missing (the tails of up to ``FETCH_BATCH_FILES`` files in
    one call with ``fetch_many``, a tail longer than ``FETCH_CHUNK_BYTES`` on its own with
    ``fetch``). Returns the bytes fetched."""
    for path in _state_files(root):
        if path not in files:
            (root / path).unlink()
    _remove_empty_hour_dirs(root / WHEEL / "hours")
    lacking = [(path, have, size - have) for path, size in files.items()
               if (have := _cut(root / path, size)) < size]
    return fetch_tails(root, lacking, fetch, fetch_many)


def fetch_tails(root: Path, lacking: list[Range], fetch: Fetch,
                fetch_many: FetchMany | None = None) -> int:
    """Append to each file under ``root`` the bytes it lacks, ``(path, have, missing)`` each
    (the file is ``have`` bytes long), fetched from a peer: the tails of up to
    ``FETCH_BATCH_FILES`` files in one call with ``fetch_many``, a tail longer than
    ``FETCH_CHUNK_BYTES`` on its own with ``fetch``. Returns the bytes fetched."""
    if not lacking:
        return 0
    small = [] if fetch_many is None else [r for r in lacking if r[2] <= FETCH_CHUNK_BYTES]
    alone = [r for r in lacking if fetch_many is None or r[2] > FETCH_CHUNK_BYTES]
    with ThreadPoolExecutor(FETCH_PARALLEL, thread_name_prefix="restore") as pool:
        done = [] if fetch_many is None else [pool.submit(_fetch_batch, root, batch, fetch_many)
                                              for batch in _batches(small)]
        done += [pool.submit(_fetch_tail, root, asked, fetch) for asked in alone]
        return sum(future.result() for future in done)


def copies_under(copies: CopySource, folder: str, path: str, offset: int, size: int
                  ) -> Iterable[bytes | None]:
    """``copies`` of ``path`` relative to ``folder`` (the wheel's paths are its own)."""
    return copies(f"{folder}/{path}", offset, size)


def _state_files(root: Path) -> list[str]:
    """Every append-only state file under ``root``, relative to it."""
    found = []
    for directory, _, names in os.walk(root):
        relative = Path(directory).relative_to(root)
        for name in names:
            if name in APPEND_ONLY_FILES or (
                    relative.parts[:1] == (DEDUPE,) and name.isdigit()):
                found.append(str(relative / name))
    return found


def _remove_empty_hour_dirs(hours: Path) -> None:
    if not hours.exists():
        return
    for hour in os.listdir(hours):
        files = set(os.listdir(hours / hour))
        if not files - {"heads"}:
            shutil.rmtree(hours / hour)


def _cut(path: Path, size: int) -> int:
    """Cut ``path`` (created if missing) to at most ``size`` bytes; its length then."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as file:
        have = file.seek(0, os.SEEK_END)
        if have > size:
            file.truncate(size)
        return min(have, size)


def _batches(ranges: list[Range]) -> list[list[Range]]:
    """``ranges`` in groups of at most ``FETCH_BATCH_FILES`` and ``FETCH_CHUNK_BYTES``."""
    batches: list[list[Range]] = []
    total = FETCH_CHUNK_BYTES + 1
    for asked in ranges:
        if len(batches[-1] if batches else ()) >= FETCH_BATCH_FILES or (
                total + asked[2] > FETCH_CHUNK_BYTES):
            batches.append([])
            total = 0
        batches[-1].append(asked)
        total += asked[2]
    return batches


def _fetch_batch(root: Path, batch: list[Range], fetch_many: FetchMany) -> int:
    """Append each file's missing tail, all fetched in one call; bytes fetched."""
    for (name, offset, size), data in zip(batch, fetch_many(batch), strict=True):
        invariant(len(data) == size, f"{name}: fetched {len(data)} bytes, wanted {size}")
        with open(root / name, "ab") as file:
            invariant(file.tell() == offset, f"{name} is {file.tell()} bytes, not {offset}")
            file.write(data)
    return sum(size for _, _, size in batch)


def _fetch_tail(root: Path, asked: Range, fetch: Fetch) -> int:
    """Append the missing tail of one file, ``FETCH_CHUNK_BYTES`` a call; bytes fetched."""
    name, have, size = asked[0], asked[1], asked[1] + asked[2]
    with open(root / name, "ab") as file:
        while have < size:
            chunk = fetch(name, have, min(FETCH_CHUNK_BYTES, size - have))
            invariant(len(chunk) > 0, f"peer returned nothing for {name} at {have}")
            file.write(chunk)
            have += len(chunk)
        invariant(have == size, f"{name}: fetched to {have}, wanted {size}")
    return asked[2]

