"""A console with a live page open stops on SIGTERM within its grace (the page's event
stream never ends by itself: uvicorn waited for it for ever), on a 1-node cluster of its own."""

from __future__ import annotations

import re
import signal
import ssl
import threading
import time
from pathlib import Path

import httpx
import pytest

from tickwheel.harness.console_process import ConsoleProcess
from tickwheel.harness.local_cluster import LocalCluster

pytestmark = pytest.mark.cluster


def test_sigterm_stops_a_console_with_a_live_page_open(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, 1) as cluster, ConsoleProcess(cluster) as console:
        cluster.leader(timeout_s=30)
        assert cluster.security is not None and console.process is not None
        web = httpx.Client(base_url=console.url, timeout=30, verify=ssl.create_default_context(
            cafile=str(cluster.security.ca_file)))
        form = web.get("/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert csrf is not None
        web.post("/login", data={"csrf": csrf.group(1), "token": console.token_file().read_text()})
        streaming = threading.Event()

        def watch() -> None:
            try:
                with web.stream("GET", "/live/cluster") as stream:
                    for line in stream.iter_lines():
                        if line.startswith("event: update"):
                            streaming.set()
            except httpx.HTTPError:
                pass  # the console closed it on its way out

        reader = threading.Thread(target=watch, daemon=True)
        reader.start()
        assert streaming.wait(10), "no update came"
        began = time.monotonic()
        console.process.send_signal(signal.SIGTERM)
        console.process.wait(timeout=10)  # TimeoutExpired before: it waited for the stream
        assert time.monotonic() - began < 10
        reader.join(10)
        web.close()
