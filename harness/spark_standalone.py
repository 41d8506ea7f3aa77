"""A standalone Spark cluster on this machine: a master and workers as separate processes,
started with the scripts pyspark ships (``bin/spark-class org.apache.spark.deploy.master.Master``
and ``...worker.Worker``), bound to 127.0.0.1, stopped by PID. For the audit's proof that a
cluster gives what local mode gives (tests/audit) and its benchmark (`audit_bench`).

The rule kept: `StandaloneSpark` returns only once every worker has registered with the
master (its web UI's ``/json/`` lists them ``ALIVE``), so a job submitted then has their cores;
each process logs to ``ROOT/<name>.log`` and works in ``ROOT/work``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Self

import pyspark

from tickwheel.harness.ports import free_ports
from tickwheel.harness.processes import wait_for

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class StandaloneSpark:
    """A master and ``workers`` workers of ``cores`` cores and ``memory`` each under ``root``;
    a context manager. ``url`` is the master's (``spark://127.0.0.1:PORT``)."""

    def __init__(self, root: Path, workers: int = 2, cores: int = 1, memory: str = "1g",
                 timeout_s: float = 120.0) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        port, ui_port, *worker_ports = free_ports(2 + 2 * workers)
        self.url = f"spark://127.0.0.1:{port}"
        self._ui = f"http://127.0.0.1:{ui_port}/json/"
        self._processes: list[subprocess.Popen[bytes]] = []
        try:
            self._start("master", MASTER_CLASS, "--host", "127.0.0.1", "--port", str(port),
                        "--webui-port", str(ui_port))
            for number in range(workers):
                self._start(f"worker{number}", WORKER_CLASS, "--host", "127.0.0.1",
                            "--port", str(worker_ports[2 * number]),
                            "--webui-port", str(worker_ports[2 * number + 1]),
                            "--cores", str(cores), "--memory", memory,
                            "--work-dir", str(root / "work"), self.url)
            wait_for(lambda: self.alive_workers() == workers, timeout_s,
                     f"{workers} Spark workers to register", poll_s=0.5)
        except BaseException:
            self.stop()
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def alive_workers(self) -> int:
        """Workers the master lists ``ALIVE`` (0 while it does not answer)."""
        try:
            with urllib.request.urlopen(self._ui, timeout=2) as answer:
                state = json.load(answer)
        except (OSError, ValueError):
            return 0
        return sum(worker.get("state") == "ALIVE" for worker in state.get("workers", []))

    def stop(self) -> None:
        """SIGTERM to each process it started (workers first), SIGKILL after 10 s."""
        for process in reversed(self._processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in reversed(self._processes):
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes.clear()

    def _start(self, name: str, main_class: str, *args: str) -> None:
        home = Path(pyspark.__file__).parent
        env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_LOG_DIR": str(self.root), "SPARK_WORKER_DIR": str(self.root / "work"),
               "PYSPARK_PYTHON": sys.executable}
        with (self.root / f"{name}.log").open("ab") as log:
            self._processes.append(subprocess.Popen(
                [str(home / "bin" / "spark-class"), main_class, *args], env=env,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
