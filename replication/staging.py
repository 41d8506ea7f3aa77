"""The state folder a snapshot install switches to: gathered and opened off the Raft thread
beside the live one, then made the state by replacing one symbolic link on it.

A follower that installs a leader's snapshot needs every file the snapshot names, at its
length (`state_files.Manifest`). Most bytes are on its disk already; the rest are fetched
from its peers, which took 1.2-1.3 s for 750 files in a chaos run, and opening the wheel on
them reads every hour's index: the Raft thread must go on stepping meanwhile. So `stage` (on
a thread of its own) builds a new *generation* of the state beside it, ``DATA/state.<n>``:
a file this node holds at exactly the named length is hard-linked, one it holds in part is
copied up to what it holds and its tail fetched, a missing one fetched whole, and each
hour's ``heads`` checkpoint copied (the wheel checks it against the index when it opens the
hour). The caller opens the wheel and the dedupe window on it there. `switch` then points
``DATA/state`` at it: a symbolic link replaced by a rename, atomic, whatever the number of
files. The generation it pointed at before is deleted off the Raft thread. Until a node's
first such install ``DATA/state`` is a plain folder; that first switch moves it aside
(``state.old``) before it links.

Why not fetch straight into the ends of the live files, which only grow? Nothing applies
while a snapshot is fetched, but the live wheel still opens hours as it reads (a due-time
histogram, the walk ahead of the cursor): opening one reads its index to the end and cuts a
torn tail, and a fetch appending there meanwhile leaves a unit half written, which that cut
would race. A generation is seen by nobody but the thread that builds it. What keeps the hard
links safe: the live files do not change while a generation is staged (the wheel and the
dedupe window are flushed before it starts, and nothing applies until the switch), and once
replaced, a generation is only deleted.

A crash at any point leaves a node that `tidy` puts right at its next start: before the
switch, ``DATA/state`` is whole and its own snapshot names it, and a generation it does not
point at is deleted; within a plain folder's first switch, it comes back from ``state.old``.
(A node stopped after the leader's snapshot was put in place but before the switch installs
that snapshot on the live state at its restart, as any restart does, fetching what it lacks.)

Callers: `Snapshots` (`tickwheel.replication.snapshots`): `stage` on its fetching thread,
`switch` on the Raft thread, `tidy` before the state is opened.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tickwheel.common.errors import invariant
from tickwheel.replication.state_files import WHEEL, Fetch, FetchMany, Range, fetch_tails
from tickwheel.wheel.fileio import HEADS

RETIRED = ".old"
LINKING = ".link"
"""Suffixes of the state folder's name: a plain state folder moved aside by its first switch,
and the new link before it replaces the old."""


def stage(root: Path, files: dict[str, int], fetch: Fetch,
          fetch_many: FetchMany | None = None) -> tuple[Path, int]:
    """Build a new generation beside ``root`` (the state folder, or its link) that holds
    exactly ``files`` (paths relative to it, with their lengths), from ``root``'s own files
    and the peers' (`fetch`, `fetch_many`). ``root`` must not change meanwhile. Returns the
    generation's folder and the bytes fetched."""
    _remove_unused(root)
    folder = _next_generation(root)
    folder.mkdir()
    lacking: list[Range] = []
    hours: set[Path] = set()
    for name, size in files.items():
        source, target = root / name, folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if name.startswith(f"{WHEEL}/"):
            hours.add(Path(name).parent)
        have = source.stat().st_size if source.exists() else 0
        if have == size and size > 0:
            os.link(source, target)
            continue
        _copy_prefix(source, target, min(have, size))
        if have < size:
            lacking.append((name, have, size - have))
    for hour in hours:
        if (root / hour / HEADS).exists():
            shutil.copyfile(root / hour / HEADS, folder / hour / HEADS)
    return folder, fetch_tails(folder, lacking, fetch, fetch_many)


def staged_paths(folder: Path, files: dict[str, int]) -> list[Path]:
    """A generation's files and every folder that holds them, deepest first: what an
    install under ``fsync`` syncs before the switch."""
    paths = [folder / name for name in sorted(files)]
    folders = {parent for path in paths for parent in path.parents
               if parent == folder or folder in parent.parents}
    return [*paths, *sorted(folders, key=lambda f: len(f.parts), reverse=True)]


def switch(root: Path, folder: Path) -> Path:
    """Point ``root`` at the generation ``folder``; returns what it was before (a generation,
    or the plain folder moved aside), for the caller to delete off the Raft thread."""
    invariant(folder.parent == root.parent and folder.is_dir(), f"{folder} is not staged")
    linking = root.with_name(root.name + LINKING)
    linking.unlink(missing_ok=True)
    linking.symlink_to(folder.name)
    if root.is_symlink():
        before = root.resolve()
    else:
        before = root.with_name(root.name + RETIRED)
        invariant(not before.exists(), f"{before} is still there")
        os.rename(root, before)
    os.replace(linking, root)
    return before


def tidy(root: Path) -> None:
    """Before the state is opened: put back or delete what an install left (see the module's
    docstring)."""
    retired = root.with_name(root.name + RETIRED)
    if not root.exists() and not root.is_symlink() and retired.exists():
        os.rename(retired, root)  # stopped within the first switch
    _remove_unused(root)


def remove_state(root: Path) -> None:
    """Delete the state folder (its generation, if it is a link) and every generation beside
    it."""
    if root.is_symlink():
        shutil.rmtree(root.resolve(), ignore_errors=True)
        root.unlink()
    elif root.exists():
        shutil.rmtree(root)
    _remove_unused(root)


def _remove_unused(root: Path) -> None:
    """Delete the generations beside ``root`` that it does not point at, a plain folder moved
    aside, and a link not yet in place."""
    current = root.resolve() if root.is_symlink() else None
    for path in root.parent.glob(f"{root.name}.*"):
        if path == current:
            continue
        if path.is_symlink() or path.is_file():
            path.unlink()
        else:
            shutil.rmtree(path, ignore_errors=True)


def _next_generation(root: Path) -> Path:
    """A generation's name beside ``root`` that none has had since the last `tidy`."""
    numbers = [int(suffix) for path in root.parent.glob(f"{root.name}.*")
               if (suffix := path.name[len(root.name) + 1:]).isdigit()]
    if root.is_symlink():
        numbers.append(int(root.resolve().name[len(root.name) + 1:]))
    return root.with_name(f"{root.name}.{max(numbers, default=0) + 1}")


def _copy_prefix(source: Path, target: Path, size: int) -> None:
    """``target`` made of the first ``size`` bytes of ``source`` (empty if ``size`` is 0)."""
    with open(target, "wb") as out:
        if size == 0:
            return
        with open(source, "rb") as src:
            copied = 0
            while copied < size:
                done = os.copy_file_range(src.fileno(), out.fileno(), size - copied)
                invariant(done > 0, f"{source} ended at {copied} bytes, before {size}")
                copied += done
