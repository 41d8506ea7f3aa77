"""Mending: a damaged record or index unit rewritten from a good copy held elsewhere.

Every record and index unit carries a CRC, and replicas fed the same commands write
byte-identical files, so when a stored unit or record fails its check the same byte range of
the same file on another replica is the bytes that belong there. The wheel knows nothing of
replicas: whoever opens it may give it a `CopySource`, which yields what each other holder of
the files has at a range. The first copy that passes the same check is written over the
damaged bytes (and synced), and the read goes on as if nothing had happened; the damage is
logged (``event=storage_mended``) and counted.

When no copy passes, the outcome says whether every holder answered (`Mend.everywhere`: the
bytes are damaged everywhere, and nothing will ever bring them back) or some could not be asked
(the caller should hold on and try again later). Without a source (a wheel of its own), every
damage is "everywhere".
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tickwheel.common.errors import CorruptSegment

log = logging.getLogger("tickwheel.wheel")

CopySource = Callable[[str, int, int], Iterable[bytes | None]]
"""``source(path, offset, size)``: for each other holder of the wheel's files, the ``size``
bytes it has at ``offset`` of ``path`` (relative to the wheel's root), or None when that holder
could not answer (unreachable, or its file is shorter)."""


class Unmended(CorruptSegment):
    """Damaged bytes that no copy could replace. ``everywhere``: every holder answered and
    none had good bytes, so trying again cannot help."""

    def __init__(self, where: str, problem: str, everywhere: bool) -> None:
        super().__init__(where, problem)
        self.everywhere = everywhere


@dataclass
class MendCounts:
    """What mending did since the wheel opened."""

    units: int = 0
    """Index units rewritten from a good copy."""
    records: int = 0
    """Log records rewritten from a good copy."""
    unmended: int = 0
    """Damaged units or records no copy could replace (each attempt counts)."""


class Mender:
    """Rewrites damaged ranges of the files under ``root`` from ``source`` (None: none)."""

    def __init__(self, root: Path, source: CopySource | None,
                 counts: MendCounts | None = None) -> None:
        self._root = root
        self._source = source
        self.counts = counts or MendCounts()

    def mend(self, path: Path, offset: int, size: int, check: Callable[[bytes], bool],
             damage: CorruptSegment) -> bytes:
        """Replace ``size`` bytes at ``offset`` of ``path``, which failed ``check`` (the
        ``damage``), with the first copy that passes it, and return them; `Unmended` if no
        copy does."""
        relative = str(path.relative_to(self._root))
        answered = asked = 0
        for copy in (self._source(relative, offset, size) if self._source else ()):
            asked += 1
            if copy is None:
                continue
            answered += 1
            if len(copy) == size and check(copy):
                _overwrite(path, offset, copy)
                kind = "unit" if path.name == "index" else "record"
                setattr(self.counts, f"{kind}s", getattr(self.counts, f"{kind}s") + 1)
                log.warning("event=storage_mended kind=%s file=%s offset=%d size=%d damage=%r",
                            kind, path, offset, size, str(damage))
                return copy
        self.counts.unmended += 1
        everywhere = answered == asked
        log.error("event=storage_unmended file=%s offset=%d size=%d holders_asked=%d "
                  "answered=%d everywhere=%s damage=%r", path, offset, size, asked, answered,
                  everywhere, str(damage))
        raise Unmended(damage.where, f"{damage}; no good copy (asked {asked}, {answered} "
                       "answered)", everywhere)


def _overwrite(path: Path, offset: int, data: bytes) -> None:
    """Write ``data`` at ``offset`` in place (never appending) and sync it: a mend is rare, and
    must not be lost to a power cut after the damaged copy was reported repaired."""
    fd = os.open(path, os.O_WRONLY)
    try:
        written = os.pwrite(fd, data, offset)
        if written != len(data):
            raise OSError(f"short write mending {path} at {offset}: {written} of {len(data)}")
        os.fsync(fd)
    finally:
        os.close(fd)
