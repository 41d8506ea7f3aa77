"""A follower catching up by snapshot, with real nodes: its Raft thread keeps stepping while
the snapshot's files are fetched (no step near what an install took, no election), and a SIGKILL in
the middle of that fetch leaves a node that restarts and converges, and one rolled back to
0.0.4 opens the state an install left (docs/replication.md, "A follower that falls
behind")."""

from __future__ import annotations

import hashlib
import re
import shutil
import signal
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from tickwheel.harness.local_cluster import LocalCluster, LocalNode, wait_for
from tickwheel.replication.raft import journal_first_index
from tickwheel.v1 import tickwheel_pb2 as pb

pytestmark = pytest.mark.cluster

RELEASE_WHEEL = (Path(__file__).parent.parent / "fixtures" / "upgrade"
                 / "tickwheel-0.0.4-c5effa3.whl")
HOURS = 600
"""Hours the messages are spread over: about 1,200 state files (log and index an hour), which
a follower fetched and opened in one Raft step of 0.8-1.4 s on a 2-core machine before its
install moved off the Raft thread."""
LONG_STEP_S = "0.25"
"""A step longer than this bucket of ``tickwheel_raft_step_seconds`` fails the test: far below
what the install took on the Raft thread, far above what a busy host's preemption makes of a
short step (50 ms is the benchmark's bound, harness/install_bench.py, not a timed test's)."""


def spread(prefix: str, hours: int, first_due_ms: int) -> list[pb.Message]:
    """Four messages an hour for ``hours`` hours from ``first_due_ms``."""
    return [pb.Message(id=f"{prefix}-{i}", topic="orders", body=b"x" * 100,
                       deliver_at_ms=first_due_ms + i * 900_000) for i in range(4 * hours)]


def schedule_all(cluster: LocalCluster, batch: list[pb.Message], per_call: int = 50) -> None:
    for start in range(0, len(batch), per_call):
        cluster.schedule(batch[start:start + per_call])


def compact_past(cluster: LocalCluster, leader: LocalNode, first_due_ms: int) -> None:
    """Schedule one message a call until the leader's snapshot holds every entry applied so
    far: a follower sent it then has only those small entries to apply after it (applying
    the big ones on a follower whose wheel has opened no hour yet is a step of its own)."""
    applied = wait_for(leader.info, 5, "the leader's status").last_applied
    for i in range(200):
        if (journal_first_index(leader.data / "raft" / "journal") or 0) > applied:
            return
        cluster.schedule([pb.Message(id=f"tiny-{first_due_ms}-{i}", topic="orders",
                                     body=b"t", deliver_at_ms=first_due_ms)])
    raise AssertionError("the leader took no snapshot in 200 entries")


def caught_up(nodes: list[LocalNode]) -> bool:
    infos = [node.info() for node in nodes]
    return all(infos) and len({(i.last_applied, i.cursor_second) for i in infos}) == 1


def this_life(node: LocalNode) -> str:
    """What ``node`` logged since it last started."""
    text = node.log_path.read_text()
    return text[text.rfind("event=node_started"):]


def wheel_digests(node: LocalNode) -> dict[str, str]:
    """The wheel's append-only files by path (heads is a checkpoint rebuilt from the index), of
    a node stopped: a running one holds appends buffered, which nodes write at different
    times (a snapshot writes those it names over several steps)."""
    assert not node.alive(), f"{node.data} is still running"
    hours = node.data / "state" / "wheel" / "hours"
    return {str(p.relative_to(hours)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(hours.rglob("*")) if p.is_file() and p.name != "heads"}


def test_a_wiped_follower_installs_a_snapshot_of_many_files_in_short_steps_without_elections(
        tmp_path: Path) -> None:
    with LocalCluster(tmp_path, extra_args=("--snapshot-min-entries", "20"),
                      metrics=True) as cluster:
        start_ms = int(time.time() * 1000) + 3_600_000
        schedule_all(cluster, spread("order", HOURS, start_ms))
        leader = cluster.leader()
        compact_past(cluster, leader, start_ms)
        follower = next(n for n in cluster.nodes if n is not leader)
        cluster.stop(follower)
        shutil.rmtree(follower.data)
        wait_for(lambda: caught_up([n for n in cluster.nodes if n is not follower]), 30,
                 "the other two at one index")
        before = [node.info() for node in cluster.nodes if node is not follower]
        cluster.start(follower)
        wait_for(lambda: "event=snapshot_installed" in this_life(follower), 60, "the install")
        wait_for(lambda: caught_up(cluster.nodes), 30, "the wiped follower caught up")
        after = [node.info() for node in cluster.nodes]
        life = this_life(follower)
        # the Raft thread waited between steps throughout (its histogram counts this life)
        text = urllib.request.urlopen(f"http://{follower.metrics_address}/metrics",
                                      timeout=5).read().decode()
        count, short = (float(re.search(rf"^tickwheel_raft_step_seconds_{name} (\S+)$", text,
                                        re.M).group(1))
                        for name in ("count", f'bucket{{le="{LONG_STEP_S}"}}'))
        assert count > 0 and count - short == 0, (count, short)
        assert "event=snapshot_fetched files=" in life
        terms = {info.term if info else None for info in [*before, *after]}
        assert len(terms) == 1, terms  # no election: every node in the term it began in
        cluster.stop_all()
        assert wheel_digests(follower) == wheel_digests(leader)


def test_a_follower_killed_while_it_fetches_a_snapshot_restarts_and_converges(
        tmp_path: Path) -> None:
    with LocalCluster(tmp_path, extra_args=("--snapshot-min-entries", "20")) as cluster:
        start_ms = int(time.time() * 1000) + 3_600_000
        schedule_all(cluster, spread("early", HOURS // 3, start_ms), per_call=10)
        leader = cluster.leader()
        follower = next(n for n in cluster.nodes if n is not leader)
        wait_for(lambda: caught_up(cluster.nodes) and (
            follower.data / "raft" / "snapshot").exists(), 30, "a follower's own snapshot")
        cluster.stop(follower)
        schedule_all(cluster, spread("late", HOURS, start_ms + 450_000))
        compact_past(cluster, leader, start_ms)
        cluster.start(follower)
        generation = follower.data / "state.1"  # what an install gathers, beside the state
        wait_for(generation.exists, 60, "the follower fetching the leader's snapshot",
                 poll_s=0.002)
        cluster.signal(follower, signal.SIGKILL)
        follower.started.wait(10)
        assert "event=snapshot_fetched" not in this_life(follower)  # killed mid-fetch
        assert not (follower.data / "state").is_symlink()
        cluster.start(follower)
        wait_for(lambda: caught_up(cluster.nodes), 60, "the killed follower caught up")
        current = (follower.data / "state").resolve()
        wait_for(lambda: {p.name for p in follower.data.glob("state*")} == {
            "state", current.name}, 10, "nothing left beside the state but its generation")
        cluster.stop_all()
        assert wheel_digests(follower) == wheel_digests(leader)


def test_a_follower_rolled_back_to_0_0_4_after_an_install_opens_its_state_through_the_link(
        tmp_path: Path) -> None:
    """Until an upgrade is finalized any member may go back to 0.0.4 (deploy/README.md): an
    install leaves ``DATA/state`` a symbolic link to a generation, which 0.0.4 knows nothing
    of and opens as the folder it points at."""
    release = tmp_path / "release-0.0.4"
    with zipfile.ZipFile(RELEASE_WHEEL) as wheel:
        wheel.extractall(release)
    cluster = LocalCluster(tmp_path / "cluster", extra_args=("--snapshot-min-entries", "20"),
                           ledger_segment_age_ms=None)  # 0.0.4 has no ledger
    for node in cluster.nodes:
        node.build = release
    with cluster:
        cluster.leader(30)
        for node in cluster.nodes:  # every member to this build, the cluster not finalized
            cluster.stop(node)
            node.build = None
            cluster.start(node)
            cluster.leader(30)
        start_ms = int(time.time() * 1000) + 3_600_000
        schedule_all(cluster, spread("order", HOURS // 3, start_ms), per_call=10)
        leader = cluster.leader(30)
        follower = next(n for n in cluster.nodes if n is not leader)
        cluster.stop(follower)
        shutil.rmtree(follower.data)
        compact_past(cluster, leader, start_ms)
        cluster.start(follower)
        wait_for(lambda: caught_up(cluster.nodes), 60, "the wiped follower caught up")
        assert (follower.data / "state").is_symlink()
        cluster.stop(follower)
        follower.build = release
        cluster.start(follower)
        cluster.schedule([pb.Message(id="after", topic="orders", body=b"a",
                                     deliver_at_ms=start_ms)])
        wait_for(lambda: caught_up(cluster.nodes), 60, "the follower back on 0.0.4 caught up")
        assert follower.info() and follower.info().cluster_version == 0  # 0.0.4's answer
        cluster.stop_all()
        assert wheel_digests(follower) == wheel_digests(leader)
