"""``tickwheel cluster up``, the installed command as a user runs it: the command comes from the
top layer, `tickwheel.cli` (the node's own commands cannot start node processes), so this
checks the entry point carries it, and ``python -m tickwheel.node`` does not."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import numbered_ports
import pytest

from tickwheel.harness.local_cluster import wait_for

pytestmark = pytest.mark.cluster

TICKWHEEL = Path(sys.executable).with_name("tickwheel")


def start_cluster_up(tmp_path: Path, base_port: int, *flags: str,
                     until: str = "tickwheel status") -> tuple[subprocess.Popen[str], str]:
    """``tickwheel cluster up`` with one node, and what it printed until a line with
    ``until`` (its ready table's last)."""
    up = subprocess.Popen([str(TICKWHEEL), "cluster", "up", "--nodes", "1", "--data",
                           str(tmp_path / "cluster"), "--base-port", str(base_port), *flags],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "COLUMNS": "300"})
    lines: list[str] = []
    assert up.stdout is not None
    wait_for(lambda: bool(lines.append(up.stdout.readline()) or until in lines[-1]
                          or up.poll() is not None), 60, f"a line with {until!r}")
    printed = "".join(lines)
    # read on what it prints: a pipe nobody reads fills, and then its writes block it
    threading.Thread(target=lambda: lines.extend(up.stdout or ()), daemon=True).start()
    return up, printed


def port_is_free(port: int) -> bool:
    """Whether a server could listen on ``port`` now (as servers do, past connections of the
    last one still in TIME_WAIT)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_cluster_up_runs_a_secured_cluster_until_ctrl_c(tmp_path: Path) -> None:
    base_port = numbered_ports.base_port("cluster_up")
    up, printed = start_cluster_up(tmp_path, base_port)
    try:
        assert up.poll() is None, printed
        assert f"127.0.0.1:{base_port}" in printed and "(leader)" in printed
        assert "TICKWHEEL_CA_FILE=" in printed and "TICKWHEEL_TOKEN_FILE=" in printed  # secured
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=60) == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


def test_sigterm_stops_cluster_up_and_its_nodes_and_rocketmq_listeners_start_on_request(
        tmp_path: Path) -> None:
    """What ``docker stop``, systemd and CI send: the nodes stop with the command and free
    their ports (before, the command died and left its node running)."""
    base_port = numbered_ports.base_port("cluster_up_rocketmq")
    up, printed = start_cluster_up(tmp_path, base_port, "--rocketmq")
    try:
        assert up.poll() is None, printed
        rocketmq = f"127.0.0.1:{base_port + 300}"
        assert rocketmq in printed
        socket.create_connection(("127.0.0.1", base_port + 300), timeout=5).close()
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=60) == 0
        for port in (base_port, base_port + 100, base_port + 300):
            wait_for(lambda port=port: port_is_free(port), 10, f"port {port} to be freed")
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


def test_the_node_module_alone_has_no_cluster_command() -> None:
    run = subprocess.run([sys.executable, "-m", "tickwheel.node", "cluster", "up"],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 2 and "invalid choice: 'cluster'" in run.stderr


def test_cluster_up_with_console_prints_its_address_and_stops_it(tmp_path: Path) -> None:
    base_port = numbered_ports.base_port("cluster_up_console")
    up, printed = start_cluster_up(tmp_path, base_port, "--console", until="console: ")
    try:
        line = printed.splitlines()[-1]
        url = f"https://127.0.0.1:{base_port + 400}/"
        assert "tickwheel status" in printed and line.startswith(f"console: {url}"), printed
        assert str(tmp_path / "cluster" / "security" / "tokens" / "admin.token") in line
        ca = ssl.create_default_context(cafile=str(tmp_path / "cluster" / "security" / "ca.pem"))
        assert httpx.get(url + "login", verify=ca).status_code == 200
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=60) == 0
        wait_for(lambda: port_is_free(base_port + 400), 10, "the console's port to be freed")
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
