"""Waiting on and stopping the processes the harness starts: `wait_for` polls a condition with
a deadline, `stop_process` ends one process it started (SIGTERM, then SIGKILL past a timeout).

The rule it keeps: a process is stopped by its own `subprocess.Popen`, never by name, and is
reaped before `stop_process` returns. Who calls it: `LocalCluster` and `ConsoleProcess`, the
benchmarks and the chaos runner, and the tests (through `tickwheel.harness.local_cluster`, which
has always offered `wait_for`).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

Found = TypeVar("Found")


def wait_for(condition: Callable[[], Found | None], timeout_s: float, what: str,
             poll_s: float = 0.02) -> Found:
    """Poll ``condition`` until it returns something truthy, and return that; raise
    TimeoutError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)


def stop_process(process: subprocess.Popen[bytes] | subprocess.Popen[str],
                 timeout_s: float) -> None:
    """SIGTERM ``process`` and wait for it; SIGKILL it if it is still there after
    ``timeout_s``."""
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
