"""A ``tickwheel console`` process beside a `LocalCluster`: started as a user would start it
(the ``tickwheel`` command, with the cluster's CA, and the node certificate the cluster's
credentials made, which names 127.0.0.1 and localhost, for its HTTPS), and stopped by PID.

Who calls it: ``tickwheel cluster up --console`` (`tickwheel.cli.cluster`), `make demo`
(`tickwheel.harness.demo`) and the console's tests (tests/console). The rule it keeps: it
returns from `ConsoleProcess.start` only once the console accepts connections, and
`ConsoleProcess.stop` ends the process it started and no other.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

from tickwheel.harness.local_cluster import LocalCluster
from tickwheel.harness.ports import free_ports
from tickwheel.harness.processes import stop_process

STARTING_TIMEOUT_S = 30.0


class ConsoleProcess:
    """The console of ``cluster`` on 127.0.0.1:``port`` (a free one if None); its output goes
    to ``log_path`` (``ROOT/console.log``)."""

    def __init__(self, cluster: LocalCluster, port: int | None = None) -> None:
        if cluster.security is None:
            raise ValueError("the console serves HTTPS and calls over TLS: the cluster needs "
                             "its credentials (not --insecure-grpc)")
        self.security = cluster.security
        self.port = port if port is not None else free_ports(1)[0]
        self.nodes = ",".join(node.grpc_address for node in cluster.nodes)
        self.log_path: Path = cluster.root / "console.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/"

    def token_file(self, principal: str = "admin") -> Path:
        """Where the token to log in as ``principal`` is."""
        return self.security.token_file(principal)

    def start(self, timeout_s: float = STARTING_TIMEOUT_S) -> Self:
        command = [sys.executable, "-m", "tickwheel.cli", "console", "--nodes", self.nodes,
                   "--ca-file", str(self.security.ca_file),
                   "--cert-file", str(self.security.cert_file),
                   "--key-file", str(self.security.key_file),
                   "--listen", f"127.0.0.1:{self.port}"]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while not self._accepting():
            if self.process.poll() is not None:
                raise RuntimeError(f"the console exited ({self.process.returncode}): see "
                                   f"{self.log_path}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the console did not listen within {timeout_s} s")
            time.sleep(0.05)
        return self

    def _accepting(self) -> bool:
        with socket.socket() as probe:
            probe.settimeout(0.2)
            return probe.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self, timeout_s: float = 10.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        stop_process(process, timeout_s)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
