"""Hypothesis profiles: ``ci`` (default) keeps ``make test`` short; ``deep`` searches longer.

Select with ``HYPOTHESIS_PROFILE=deep``. Every failure prints its seed and steps, so it replays.
Also the fixtures that cluster tests share.
"""

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tickwheel.chaos.storage import MountFailed, mount_disk, unmount_disk
from tickwheel.harness.local_cluster import AckingConsumer, LocalCluster
from tickwheel.node.security import dev_credentials
from tickwheel.node.security.dev_credentials import DevCredentials

settings.register_profile("ci", max_examples=150, stateful_step_count=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=3_000, stateful_step_count=80, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

LOG_TAIL_LINES = 25
"""Lines of each node's log a failed test's report shows (the chattiest events left out)."""
_QUIET_EVENTS = ("event=snapshot_taken", "event=health ")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Iterator[None]:
    """A failed test that started nodes (`LocalCluster` writes ``<tmp_path>/<node>.log``)
    reports the tail of each node's log: CI keeps nothing else of a run, and a timeout says
    only that something did not happen."""
    report = yield
    tmp_path = getattr(item, "funcargs", {}).get("tmp_path")
    if report.failed and tmp_path is not None:
        for log in sorted(Path(tmp_path).glob("*.log")):
            lines = [line[:200] for line in log.read_text(errors="replace").splitlines()
                     if not any(event in line for event in _QUIET_EVENTS)]
            report.sections.append((f"tail of {log.name}",
                                    "\n".join(lines[-LOG_TAIL_LINES:])))
    return report


@pytest.fixture
def acking_consumer() -> Iterator[Callable[..., AckingConsumer]]:
    """``acking_consumer(cluster, topic)`` starts an `AckingConsumer` of ``topic``; every one
    is closed at teardown."""
    started: list[AckingConsumer] = []

    def start(cluster: LocalCluster, topic: str = "orders", prefetch: int = 1_000
              ) -> AckingConsumer:
        started.append(AckingConsumer(cluster, topic, prefetch=prefetch))
        return started[-1]

    yield start
    for consumer in started:
        consumer.close()


@pytest.fixture(scope="session")
def dev_security(tmp_path_factory: pytest.TempPathFactory) -> DevCredentials:
    """One set of development TLS files and an access file, for settings tests."""
    return dev_credentials.make(tmp_path_factory.mktemp("security"))


@pytest.fixture
def tls_env(monkeypatch: pytest.MonkeyPatch, dev_security: DevCredentials
            ) -> pytest.MonkeyPatch:
    """``TICKWHEEL_TLS_*`` and ``TICKWHEEL_ACCESS_FILE`` set, as a deployment sets them: the
    settings a node refuses to start without."""
    for name, value in dev_security.node_environment().items():
        monkeypatch.setenv(name, value)
    return monkeypatch


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[str, str], Path]]:
    """``small_disk(name, size)``: a folder on a tmpfs of its own of ``size`` (``"8m"``), a
    disk that really fills up; unmounted at teardown. Mounting needs root (CI runs as root);
    without it the test is skipped and says why."""
    mounted: list[Path] = []

    def mount(name: str, size: str) -> Path:
        path = tmp_path / name
        try:
            mount_disk(path, size)
        except MountFailed as error:
            pytest.skip(f"a small disk is a tmpfs, and {error}")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        unmount_disk(path)
