"""``tickwheel cluster up``, the installed command as a user runs it: the command comes from the
harness layer (the node's own commands cannot start node processes), so this checks the entry
point carries it, and ``python -m tickwheel.node`` does not."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tickwheel.harness.local_cluster import wait_for

pytestmark = pytest.mark.cluster

TICKWHEEL = Path(sys.executable).with_name("tickwheel")


def test_cluster_up_runs_a_secured_cluster_until_ctrl_c(tmp_path: Path) -> None:
    base_port = random.randrange(30_000, 38_000, 10)
    up = subprocess.Popen([str(TICKWHEEL), "cluster", "up", "--nodes", "1", "--data",
                           str(tmp_path / "cluster"), "--base-port", str(base_port)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        assert up.stdout is not None
        wait_for(lambda: bool(lines.append(up.stdout.readline()) or "tickwheel status"
                              in lines[-1] or up.poll() is not None), 60, "the cluster's table")
        printed = "".join(lines)
        assert up.poll() is None, printed
        assert f"127.0.0.1:{base_port}" in printed and "(leader)" in printed
        assert "TICKWHEEL_CA_FILE=" in printed and "TICKWHEEL_TOKEN_FILE=" in printed  # secured
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=30) == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


def test_the_node_module_alone_has_no_cluster_command() -> None:
    run = subprocess.run([sys.executable, "-m", "tickwheel.node", "cluster", "up"],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 2 and "invalid choice: 'cluster'" in run.stderr
