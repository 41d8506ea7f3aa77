"""The process: gRPC server, dispatcher and consumer delivery, config, CLI, metrics (issue 4).

The face the layers above use (`tickwheel.harness`, `tickwheel.chaos`): the node's commands
(`main`, and the `console` they print to), how a node says its storage failed
(`EXIT_STORAGE`), the disk reserve it keeps and how it measures free space, the files of its
delivery journal (`journal_files`), the development
credentials a local cluster runs with, and the SecretKey a RocketMQ client signs with. Code
above imports these from here, never a module inside; `tests/test_layout.py` checks it.

Each name loads its module when first asked for: a process that needs the credentials (a
benchmark's consumer beside RocketMQ's official client, whose protos would clash with ours)
does not load the server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tickwheel.node.cli import main
    from tickwheel.node.dev_credentials import ADMIN as ADMIN_GRANTS
    from tickwheel.node.dev_credentials import DevCredentials, Grants
    from tickwheel.node.dev_credentials import make as make_dev_credentials
    from tickwheel.node.disk import DEFAULT_RESERVE_BYTES, free_bytes
    from tickwheel.node.journal import files as journal_files
    from tickwheel.node.rocketmq.signature import secret_key as rocketmq_secret_key
    from tickwheel.node.serve import EXIT_STORAGE
    from tickwheel.node.terminal import console

_FACE = {
    "ADMIN_GRANTS": ("dev_credentials", "ADMIN"),
    "DEFAULT_RESERVE_BYTES": ("disk", "DEFAULT_RESERVE_BYTES"),
    "EXIT_STORAGE": ("serve", "EXIT_STORAGE"),
    "DevCredentials": ("dev_credentials", "DevCredentials"),
    "Grants": ("dev_credentials", "Grants"),
    "console": ("terminal", "console"),
    "free_bytes": ("disk", "free_bytes"),
    "journal_files": ("journal", "files"),
    "main": ("cli", "main"),
    "make_dev_credentials": ("dev_credentials", "make"),
    "rocketmq_secret_key": ("rocketmq.signature", "secret_key"),
}
__all__ = [
    "ADMIN_GRANTS",
    "DEFAULT_RESERVE_BYTES",
    "EXIT_STORAGE",
    "DevCredentials",
    "Grants",
    "console",
    "free_bytes",
    "journal_files",
    "main",
    "make_dev_credentials",
    "rocketmq_secret_key",
]


def __getattr__(name: str) -> Any:
    if name not in _FACE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _FACE[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
