"""The audit on a standalone Spark cluster (a master and two workers, separate processes
bound to 127.0.0.1, `tickwheel.harness.spark_standalone`) gives the JSON local mode gives, on
the benchmark's synthetic ledger (`tickwheel.harness.audit_bench`) with its two planted
faults, which both find; ``tickwheel audit`` exits 1 on that dirty verdict either way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sparktests import QUICK_JVM

from tickwheel.harness.audit_bench import ROWS_PER_MESSAGE, SHARDS, write_ledger
from tickwheel.harness.spark_standalone import StandaloneSpark

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]
EVENTS = 20_000


def test_a_standalone_cluster_gives_what_local_mode_gives(
        tmp_path: Path, in_background: Callable[..., Any]) -> None:
    rows = write_ledger(tmp_path / "ledger", EVENTS)
    env = {**os.environ, QUICK_JVM[0]: QUICK_JVM[1]}
    command = [sys.executable, "-m", "tickwheel.audit", str(tmp_path / "ledger"), "--json",
               "--grace-ms", "500"]
    with StandaloneSpark(tmp_path / "spark", workers=2) as cluster:
        assert cluster.alive_workers() == 2
        local, remote = (in_background(subprocess.run, command + extra, capture_output=True,
                                       text=True, timeout=600, env=env)
                         for extra in ([], ["--master", cluster.url]))
    assert (local.returncode, remote.returncode) == (1, 1), remote.stderr[-3_000:]
    summary = json.loads(local.stdout)
    assert json.loads(remote.stdout) == summary
    assert summary["rows"] == rows
    last = EVENTS // ROWS_PER_MESSAGE // SHARDS - 1
    assert summary["shards"]["0"]["overdue"]["ids"] == ["m-0"]
    assert summary["shards"]["0"]["repeated"]["unflagged_ids"] == [f"m-{last}"]
    assert [len(summary["shards"][shard]["failovers"]) for shard in ("0", "1")] == [2, 2]
    assert (tmp_path / "spark" / "work").is_dir()  # the executors ran on the workers
