"""How a replica stops the process when an entry does not apply (`apply_failed`); `die` and
the codes that say why are the node's one table, `tickwheel.common.exits`."""

from __future__ import annotations

import logging
from typing import NoReturn

from tickwheel.common.errors import CorruptSegment
from tickwheel.common.exits import EXIT_APPLY_FAILED, EXIT_STATE_UNREADABLE, Die, die
from tickwheel.replication.raft import DISK_FULL

__all__ = ["Die", "apply_exit_code", "apply_failed", "die"]

log = logging.getLogger("tickwheel.replication")


def apply_exit_code(error: Exception) -> int | None:
    """What applying a committed entry that raised ``error`` stops the node with: its own
    files unreadable (`EXIT_STATE_UNREADABLE`: damaged bytes no peer could mend, an I/O
    error), or the entry itself (`EXIT_APPLY_FAILED`: a command this release does not know,
    or a bug). None for a full disk, which the Raft thread's loop reports itself."""
    if isinstance(error, OSError) and error.errno in DISK_FULL:
        return None
    if isinstance(error, OSError | CorruptSegment):
        return EXIT_STATE_UNREADABLE
    return EXIT_APPLY_FAILED


def apply_failed(die: Die, address: str, index: int, command: bytes, error: Exception,
                 code: int) -> NoReturn:
    """A committed entry did not apply: the state cannot skip it, and pysyncobj would try it
    again at every tick and apply nothing else, so the node stops, saying which entry
    (``index``, its command's kind byte and size) and why."""
    what = "state_unreadable" if code == EXIT_STATE_UNREADABLE else "apply_failed"
    log.critical("event=%s address=%s index=%d kind=%d bytes=%d error=%r", what, address, index,
                 command[1] if len(command) > 1 else -1, len(command), error)
    die(address, f"{what}: {error!r}", code)
