"""How a replica stops the process when it must not go on, and the exit codes that say why."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import NoReturn

log = logging.getLogger("tickwheel.replication")

FATAL_EXIT_CODE = 70
"""The state may no longer match the log (a bug, a failed install): a restart rebuilds it from
the snapshot and the journal."""
STORAGE_EXIT_CODE = 3
"""A node that will not serve its data folder (locked by another process, `StorageIncomplete`,
a damaged snapshot): an operator must restore the file or move the folder away."""
DISK_FULL_EXIT_CODE = 74
"""A write found the disk full despite the reserve (`tickwheel.node.ops.disk`): something else
filled it. The state cannot skip an entry, so the node stops, saying so, and a restart (once
there is space) rebuilds it from the snapshot and the journal."""


Die = Callable[[str, str, int], NoReturn]
"""``die(address, reason, code)``: `die`, or a simulation's stand-in that raises instead."""


def die(address: str, reason: str, code: int) -> NoReturn:
    """Stop the process loudly, at once: no other thread gets to act on the state."""
    log.critical("event=replica_fatal address=%s reason=%r", address, reason)
    logging.shutdown()
    os._exit(code)
