"""The exit codes of a node, in one table: what each says, and what an operator does about it.

A node never stays up when it cannot go on: it stops with one of these codes and one log line
(``event=...``) saying what and why. Every layer that stops the process takes its code from
here (the replica's `die`, the watchdog, `tickwheel serve`); docs/node.md shows the same table.

====  ============================  ===============================================================
code  name                          meaning, and the remedy
====  ============================  ===============================================================
0     ``EXIT_OK``                   stopped by SIGTERM or SIGINT
2     ``EXIT_SETTINGS``             a setting was refused (the message names it); fix the settings
3     ``EXIT_STORAGE_REFUSED``      the data folder is locked by another process, or a file it
                                    needs is missing (a compacted journal without its snapshot)
4     ``EXIT_SNAPSHOT_UNREADABLE``  a snapshot this node cannot load: its own at start, or one
                                    its leader sent (damaged, of a newer release's format, or
                                    naming state this build cannot build); restore it, run the
                                    newer release, or move the data folder away
5     ``EXIT_STATE_UNREADABLE``     its own state files cannot be read (damaged bytes no peer
                                    could mend, an I/O error); a restart mends from peers again
6     ``EXIT_APPLY_FAILED``         a committed entry failed to apply (a command this release
                                    does not know, or a bug); run the release that wrote it
7     ``EXIT_STALLED``              the applied index stood still while the commit index moved,
                                    past ``stall_exit_elections`` election timeouts (the watchdog)
70    ``EXIT_FATAL``                any other failure of the Raft thread (a broken invariant, an
                                    install that failed); a restart rebuilds the state from the
                                    snapshot and the journal
74    ``EXIT_DISK_FULL``            a write found the disk full despite the reserve; free space
====  ============================  ===============================================================
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Final, NoReturn

log = logging.getLogger("tickwheel.replication")

EXIT_OK: Final = 0
EXIT_SETTINGS: Final = 2
EXIT_STORAGE_REFUSED: Final = 3
EXIT_SNAPSHOT_UNREADABLE: Final = 4
EXIT_STATE_UNREADABLE: Final = 5
EXIT_APPLY_FAILED: Final = 6
EXIT_STALLED: Final = 7
EXIT_FATAL: Final = 70
EXIT_DISK_FULL: Final = 74

EXIT_NAMES: Final = {code: name for name, code in globals().items()
                     if name.startswith("EXIT_") and isinstance(code, int)}
"""Each code's name, for a log line or a test's message."""


Die = Callable[[str, str, int], NoReturn]
"""``die(address, reason, code)``: `die`, or a simulation's stand-in that raises instead."""


def die(address: str, reason: str, code: int) -> NoReturn:
    """Stop the process loudly, at once, with ``code``: no other thread gets to act on the
    state. The last line it logs names the code and the reason."""
    log.critical("event=replica_fatal address=%s exit=%d code=%s reason=%r", address, code,
                 EXIT_NAMES.get(code, "?"), reason)
    logging.shutdown()
    os._exit(code)
