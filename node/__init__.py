"""The process: gRPC server, dispatcher and consumer delivery, config, CLI, metrics (issue 4).

The face the layers above use (`tickwheel.harness`, `tickwheel.chaos`): the node's commands
(`main`, and the `console` they print to), how a node says its storage failed
(`EXIT_STORAGE`), the disk reserve it keeps and how it measures free space, the development
credentials a local cluster runs with, and the SecretKey a RocketMQ client signs with. Code
above imports these from here, never a module inside; `tests/test_layout.py` checks it.
"""

from tickwheel.node.cli import main
from tickwheel.node.dev_credentials import ADMIN as ADMIN_GRANTS
from tickwheel.node.dev_credentials import DevCredentials, Grants
from tickwheel.node.dev_credentials import make as make_dev_credentials
from tickwheel.node.disk import DEFAULT_RESERVE_BYTES, free_bytes
from tickwheel.node.rocketmq.signature import secret_key as rocketmq_secret_key
from tickwheel.node.serve import EXIT_STORAGE
from tickwheel.node.terminal import console

__all__ = [
    "ADMIN_GRANTS",
    "DEFAULT_RESERVE_BYTES",
    "EXIT_STORAGE",
    "DevCredentials",
    "Grants",
    "console",
    "free_bytes",
    "main",
    "make_dev_credentials",
    "rocketmq_secret_key",
]
