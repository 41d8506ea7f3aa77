"""Hypothesis profiles: ``ci`` (default) keeps ``make test`` short; ``deep`` searches longer.

Select with ``HYPOTHESIS_PROFILE=deep``. Every failure prints its seed and steps, so it replays.
Also the fixtures that cluster tests share; the guard of the ``cluster`` marker: a test that
starts a process (a node, the CLI, a JVM, a client in a subprocess) must carry it, so that
``pytest -m "not cluster"`` (``make check``) is the set that starts none; and what parallel
workers (pytest-xdist, ``make test``) need: ports of their own, files handed out in order.
"""

import json
import multiprocessing.util
import os
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from xdist.scheduler import LoadFileScheduling

from tickwheel.chaos.storage import MountFailed, mount_disk, unmount_disk
from tickwheel.client import Received
from tickwheel.harness.acking_consumer import AckingConsumer
from tickwheel.harness.local_cluster import LocalCluster
from tickwheel.harness.ports import PORT_RANGE_ENV, port_range
from tickwheel.node.security import dev_credentials
from tickwheel.node.security.dev_credentials import DevCredentials

settings.register_profile("ci", max_examples=150, stateful_step_count=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=3_000, stateful_step_count=80, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

CLUSTER = "cluster"
"""The marker of a test that starts processes (registered in pyproject.toml)."""


class UnmarkedProcessStart(RuntimeError):
    """A test without the ``cluster`` marker started, or tried to start, a process."""


_started_unmarked: list[str] | None = None
"""While a test without the marker runs (its setup, call and teardown): what it started."""

PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn",
                            "os.spawn", "os.system"})
"""The audit events (sys.audit) of every way Python starts a process: subprocess (with asyncio's
subprocesses, os.popen, Spark's JVM, the chaos runner), fork (multiprocessing's fork start
method, pty), posix_spawn, os.spawn* and os.system."""


def _refuse_unmarked(what: str) -> None:
    if _started_unmarked is not None:
        _started_unmarked.append(what)
        raise UnmarkedProcessStart(
            f"{what}\nThis test starts a process: mark it @pytest.mark.{CLUSTER} (a module "
            f"of such tests: pytestmark = pytest.mark.{CLUSTER}), so that make check, which "
            f'runs -m "not {CLUSTER}", leaves it out.')


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event in PROCESS_EVENTS:
        _refuse_unmarked(f"{event}: {str(args)[:300]}")


# An audit hook sees a start without replacing the function that starts: the attack tests
# pickle os.system by name, and a wrapper in its place would not pickle as os.system.
sys.addaudithook(_audit)


def _guarded_spawnv_passfds(path: bytes, args: list[bytes], passfds: tuple[int, ...]) -> int:
    """multiprocessing's spawn and forkserver start methods: the one way out with no event."""
    _refuse_unmarked(f"multiprocessing: {str(args)[:300]}")
    return _spawnv_passfds(path, args, passfds)


_spawnv_passfds = multiprocessing.util.spawnv_passfds
multiprocessing.util.spawnv_passfds = _guarded_spawnv_passfds


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _refusing_unmarked_starts(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _refusing_unmarked_starts(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    return (yield from _refusing_unmarked_starts(item))


def _refusing_unmarked_starts(item: pytest.Item) -> Iterator[None]:
    """One phase of ``item``; if it has no ``cluster`` marker, a process it starts fails it,
    even one started in a thread that swallowed the error."""
    global _started_unmarked  # noqa: PLW0603 (what the audit hook reads)
    if item.get_closest_marker(CLUSTER) is not None:
        return (yield)
    _started_unmarked = []
    try:
        result = yield
    finally:
        started, _started_unmarked = _started_unmarked, None
    if started:
        pytest.fail(f"{item.nodeid} is not marked {CLUSTER} and started a process:\n"
                    + "\n".join(started), pytrace=False)
    return result


FIXED_PORTS_FROM = json.loads((Path(__file__).parent / "fixtures" / "upgrade" / "expected.json")
                              .read_text())["base_port"]
"""The lowest port a test binds by number: the upgrade fixture's data folder names its node's
addresses (27400 and up); tests/node/numbered_ports.py gives higher ones still."""


def pytest_configure(config: pytest.Config) -> None:
    """A parallel worker (pytest-xdist) takes a slice of its own of the ports `free_ports`
    picks, below the fixed ones, so that two workers never pick one port: a node binds its
    ports seconds after they are picked, and again when it restarts."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if worker is None or count == 0:
        return
    usable = port_range()
    width = (min(usable.stop, FIXED_PORTS_FROM) - usable.start) // count
    first = usable.start + width * int(worker.removeprefix("gw"))
    os.environ[PORT_RANGE_ENV] = f"{first}-{first + width - 1}"


BACKGROUND_FILES = ("tests/chaos/test_audit.py", "tests/replication/test_simulation.py")
"""The files whose long work runs in the background (`in_background`): the audit's four Spark
JVMs, and the simulation (the longest file that starts no process, a minute of CPU or more).
Parallel workers get them as one unit, first: one worker runs them one after the other, at a
lower priority, in the CPU that the tests on the other workers leave idle from the start."""
FIRST_FILES = (*BACKGROUND_FILES, "tests/chaos/test_runner.py", "tests/chaos/test_burst.py",
               "tests/audit/test_chaos_agreement.py", "tests/audit/test_planted.py",
               "tests/audit/test_standalone.py")
"""Handed out first: the background files, then the chaos scenarios (the longest files that
count seconds, four minutes or so and two), and the production audit's proofs (a chaos run
and two audits; a real run and six; a standalone Spark cluster and two audits: several
minutes each), so that they do not begin late and end last."""


LONGEST_FILES = ("tests/replication/test_cluster.py", "tests/node/test_api.py",
                 "tests/rocketmq/test_official_client.py", "tests/node/test_retry.py",
                 "tests/security/test_raft_port.py", "tests/security/test_large_messages.py")
"""Of the other files that start processes, those that take longest (30-80 s each on three
workers): handed out before the rest, so that the last files handed out are short ones and
the workers end at about the same time (only the time depends on this order)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On parallel workers (``--dist loadfile``: a file's tests on one worker, so that its
    module's cluster or Spark starts once), the files in the order they are handed out:
    `FIRST_FILES`, the files that start no process, `LONGEST_FILES`, then the rest as
    collected."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return
    with_processes = {_file(item) for item in items
                      if item.get_closest_marker(CLUSTER) is not None}

    def rank(item: pytest.Item) -> tuple[int, int]:
        file = _file(item)
        if file in FIRST_FILES:
            return 0, 0
        if file not in with_processes:
            return 1, 0
        if file in LONGEST_FILES:
            return 2, LONGEST_FILES.index(file)
        return 3, 0
    items.sort(key=rank)


class _BackgroundAsOneFile(LoadFileScheduling):
    """``--dist loadfile``, with the `BACKGROUND_FILES` one unit of work; but where no test
    starts a process (``make check``, ``-m "not cluster"``), each of their tests a unit of its
    own, so that the parts of the simulation run side by side (it alone took 75-104 s)."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self._side_by_side = config.getoption("markexpr", "").strip() == f"not {CLUSTER}"

    def _split_scope(self, nodeid: str) -> str:
        file = super()._split_scope(nodeid)
        if file not in BACKGROUND_FILES:
            return file
        return nodeid if self._side_by_side else BACKGROUND_FILES[0]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadFileScheduling | None:
    """``--dist loadfile`` (make test, make check) hands out the background files as one."""
    if config.getvalue("dist") != "loadfile":
        return None
    return _BackgroundAsOneFile(config, log)


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


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


Result = TypeVar("Result")
BACKGROUND_NICE = 10
"""The nice value of `in_background`'s thread: against a busy task of nice 0 it gets a tenth of
a core, and a task of nice 0 that wakes up preempts it."""


def _lower_priority() -> None:
    """This thread alone at `BACKGROUND_NICE`: on Linux a nice value is a thread's."""
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)


@pytest.fixture(scope="session")
def in_background(request: pytest.FixtureRequest) -> Iterator[Callable[..., Any]]:
    """``in_background(function, *args, **kwargs)``: the call on a thread of this worker, its
    result returned (its exception raised). For work that takes a core for minutes and counts
    no seconds: the simulation, Spark's JVMs (a process starts with the priority of the thread
    that started it). When the run has tests that start nodes (``cluster``), the thread runs at
    a lower CPU priority: those nodes, which count seconds, get the CPU nearly as if it were
    not there, and it takes what they leave idle. Without them (``make check``) it would only
    give way to other people's work on the machine, so it runs as any test does."""
    lowered = any(item.get_closest_marker(CLUSTER) is not None for item in request.session.items)
    with ThreadPoolExecutor(1, "in-background", _lower_priority if lowered else None) as pool:
        def call(function: Callable[..., Result], *args: Any, **kwargs: Any) -> Result:
            return pool.submit(function, *args, **kwargs).result()
        yield call


@pytest.fixture
def acking_consumer() -> Iterator[Callable[..., AckingConsumer]]:
    """``acking_consumer(cluster, topic)`` starts an `AckingConsumer` of ``topic``; every one
    is closed at teardown. ``on_message`` sees each message before it is acknowledged (in the
    consumer's thread): what the consumer received, where a killed node's ledger cannot tell."""
    started: list[AckingConsumer] = []

    def start(cluster: LocalCluster, topic: str = "orders", prefetch: int = 1_000,
              on_message: Callable[[Received], None] | None = None) -> AckingConsumer:
        started.append(AckingConsumer(cluster, topic, prefetch=prefetch, on_message=on_message))
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
