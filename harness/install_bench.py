"""``python -m tickwheel.harness.install_bench --json``: what a follower catching up by snapshot
costs its Raft thread.

Three real node processes hold ``--hours`` hours of messages (four an hour, a log and an index
file an hour); the leader's snapshot is made to cover them (small schedules until it
compacts past them). One follower is stopped, its data folder deleted, and started again: it
catches up by installing the leader's snapshot. Figures, from its log and its ``/metrics``:

- ``files``, ``fetched_bytes``: what the snapshot named, and what the follower fetched;
- ``install_step_ms``: the Raft thread's part of the install (``event=snapshot_installed ...
  duration_ms``); ``fetch_ms``: the fetch off the Raft thread (``event=snapshot_fetched``),
  null for a build that fetches on it;
- ``longest_step_ms``: the follower's longest Raft step within the last 5-10 s, read once
  it caught up (``tickwheel_raft_step_longest_seconds``, a read of it after that; the
  install is a few seconds after the start); ``slow_steps``: how many of its steps since it
  started took 50 ms or more (the histogram);
- ``terms``: the terms the members reported from before the restart to the end (one: no
  election);
- ``fill_longest_step_ms``, ``fill_slow_steps``: while the messages were scheduled and
  the snapshots that hold them taken (every member takes its own, of up to 1,200 files):
  the longest step of any member (its longest within the last 5-10 s, read once the
  leader's snapshot holds them all) and how many steps of 50 ms or more all three took;
  ``take_steps_ms``: for each snapshot the members took, its longest part in one Raft step
  (``event=snapshot_taken ... longest_step_ms``; a build that takes a snapshot in one step
  logs its ``duration_ms``), longest first.

``--fsync`` starts the nodes with ``--fsync`` (a snapshot then syncs what it names).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tickwheel.harness.local_cluster import LocalCluster, LocalNode
from tickwheel.harness.processes import wait_for
from tickwheel.replication.raft import journal_first_index
from tickwheel.v1 import tickwheel_pb2 as pb


def _metrics(node: LocalNode) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{node.metrics_address}/metrics", timeout=5) as page:
        text = page.read().decode()
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
            if line.startswith("tickwheel_raft_step")}


def _logged_ms(life: str, event: str) -> float | None:
    found = re.search(rf"event={event} .*?duration_ms=([0-9.]+)", life)
    return float(found.group(1)) if found else None


def _fill(cluster: LocalCluster, hours: int) -> LocalNode:
    """Schedule four messages an hour, then small schedules until the leader's snapshot holds
    them all; returns the leader."""
    first_ms = int(time.time() * 1000) + 3_600_000
    batch = [pb.Message(id=f"m-{i}", topic="orders", body=b"x" * 100,
                        deliver_at_ms=first_ms + i * 900_000) for i in range(4 * hours)]
    for start in range(0, len(batch), 50):
        cluster.schedule(batch[start:start + 50])
    leader = cluster.leader()
    applied = wait_for(leader.info, 5, "the leader's status").last_applied
    for i in range(200):
        if (journal_first_index(leader.data / "raft" / "journal") or 0) > applied:
            return leader
        cluster.schedule([pb.Message(id=f"tiny-{i}", topic="orders", body=b"t",
                                     deliver_at_ms=first_ms)])
    raise RuntimeError("the leader took no snapshot in 200 entries")


def _slow_steps(steps: dict[str, float]) -> int:
    return int(steps['tickwheel_raft_step_seconds_bucket{le="+Inf"}']
               - steps['tickwheel_raft_step_seconds_bucket{le="0.05"}'])


def run(root: Path, hours: int, fsync: bool = False) -> dict[str, object]:
    with LocalCluster(root, extra_args=("--snapshot-min-entries", "20",
                                        *(("--fsync",) if fsync else ())),
                      metrics=True) as cluster:
        leader = _fill(cluster, hours)
        filled = [_metrics(node) for node in cluster.nodes]
        takes = sorted((float(step or whole) for node in cluster.nodes
                        for step, whole in re.findall(r"event=snapshot_taken (?:.*longest_step_"
                                                      r"ms=([0-9.]+))?.*duration_ms=([0-9.]+)",
                                                      _life(node))), reverse=True)
        follower = next(node for node in cluster.nodes if node is not leader)
        cluster.stop(follower)
        shutil.rmtree(follower.data)
        terms = {info.term for node in cluster.nodes if node is not follower
                 if (info := node.info())}
        cluster.start(follower)

        def caught_up() -> bool:
            infos = [node.info() for node in cluster.nodes]
            return all(infos) and len({i.last_applied for i in infos if i}) == 1
        wait_for(lambda: "event=snapshot_installed" in _life(follower), 120, "the install")
        wait_for(caught_up, 60, "the follower caught up")
        terms |= {info.term for node in cluster.nodes if (info := node.info())}
        counted = _metrics(follower)["tickwheel_raft_step_seconds_count"]

        def fresh() -> dict[str, float] | None:
            read = _metrics(follower)
            return read if read["tickwheel_raft_step_seconds_count"] > counted else None
        steps = wait_for(fresh, 10, "a fresh read of the steps")
        life = _life(follower)
        installed = re.search(r"event=snapshot_installed files=(\d+) fetched_bytes=(\d+)", life)
    if installed is None:
        raise RuntimeError("the follower logged no install")
    return {"hours": hours, "files": int(installed.group(1)),
            "fetched_bytes": int(installed.group(2)),
            "install_step_ms": _logged_ms(life, "snapshot_installed"),
            "fetch_ms": _logged_ms(life, "snapshot_fetched"),
            "longest_step_ms": round(steps["tickwheel_raft_step_longest_seconds"] * 1000, 1),
            "slow_steps": _slow_steps(steps),
            "terms": sorted(terms),
            "fill_longest_step_ms": round(max(
                read["tickwheel_raft_step_longest_seconds"] for read in filled) * 1000, 1),
            "fill_slow_steps": sum(map(_slow_steps, filled)), "take_steps_ms": takes}


def _life(node: LocalNode) -> str:
    text = node.log_path.read_text()
    return text[text.rfind("event=node_started"):]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=int, default=600)
    parser.add_argument("--fsync", action="store_true", help="start the nodes with --fsync")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="install-bench-") as folder:
        figures = run(Path(folder), args.hours, args.fsync)
    json.dump(figures, sys.stdout, indent=None if args.json else 2)
    print()


if __name__ == "__main__":
    main()
