"""A live clock step, for fault injection: a running node's clock jumps without a restart.

The chaos harness and the tests write an offset (ms, from the machine's clock) into
``DATA/clock-offset-ms`` (`write_clock_offset`); a node started with ``fault_injection`` reads
it at its next housekeeping round (every 0.2 s) and sets its clock's offset to it, the same
offset ``clock_skew_ms`` sets at start, replacing it, and logs ``event=clock_stepped``. A
node started without ``fault_injection`` (every production node) ignores the file and says so
once per change of it (``event=fault_injection_refused``): nobody can move a production
node's clock by writing a file. A file left behind applies again at the next start, under the
same rule.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from tickwheel.common.clock import SystemClock

log = logging.getLogger("tickwheel.node")

CLOCK_OFFSET_FILE = "clock-offset-ms"
MAX_CLOCK_OFFSET_MS = 86_400_000
"""The largest offset a step may set (a day either way): a bound on a test's typo."""


def write_clock_offset(data: Path, offset_ms: int) -> None:
    """Ask the node whose data folder is ``data`` to run its clock ``offset_ms`` from the
    machine's (atomically: the node never reads half a number)."""
    temporary = data / f".{CLOCK_OFFSET_FILE}.tmp"
    temporary.write_text(f"{offset_ms}\n")
    os.replace(temporary, data / CLOCK_OFFSET_FILE)


class ClockStep:
    """Watches ``DATA/clock-offset-ms`` for one node's clock (housekeeping, on the loop)."""

    def __init__(self, clock: SystemClock, data: Path, allowed: bool) -> None:
        self._clock = clock
        self._path = data / CLOCK_OFFSET_FILE
        self._allowed = allowed
        self._seen: tuple[int, int] | None = None
        """(inode, mtime_ns) of the file last read: each version is acted on once."""

    def check(self) -> None:
        try:
            stat = self._path.stat()
        except FileNotFoundError:
            self._seen = None
            return
        version = (stat.st_ino, stat.st_mtime_ns)
        if version == self._seen:
            return
        self._seen = version
        if not self._allowed:
            log.warning("event=fault_injection_refused file=%s this node was not started with "
                        "fault_injection (--fault-injection): its clock stays as it is",
                        self._path)
            return
        text = self._path.read_text().strip()
        try:
            offset_ms = int(text)
        except ValueError:
            log.error("event=clock_step_refused file=%s content=%r: not a whole number of ms",
                      self._path, text[:40])
            return
        if abs(offset_ms) > MAX_CLOCK_OFFSET_MS:
            log.error("event=clock_step_refused file=%s offset_ms=%d: beyond %d ms", self._path,
                      offset_ms, MAX_CLOCK_OFFSET_MS)
            return
        previous_ms, self._clock.skew_ms = self._clock.skew_ms, offset_ms
        log.warning("event=clock_stepped offset_ms=%d previous_offset_ms=%d", offset_ms,
                    previous_ms)
