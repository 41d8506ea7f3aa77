"""The faults (nemeses) the runner inflicts, one at a time, each timed and written down.

| fault | what happens |
|---|---|
| ``kill`` | SIGKILL the leader; start it again ``down_s`` later |
| ``pause`` | SIGSTOP the leader for ``pause_s`` (past the election timeout), then SIGCONT |
| ``partition`` | cut the leader off at the proxies (reset or blackhole) for ``partition_s`` |
| ``skew`` | restart a random node with its clock offset by 1 s to ``max_skew_ms`` either way |
| ``clock-step`` | step the running leader's clock to an offset of 1 s to ``max_skew_ms`` |
|                | either way, without a restart, for ``clock_step_s``; then back |
| ``restart-all`` | SIGKILL every node at once, start them all again |
| ``follower-wipe`` | SIGKILL a follower, delete its data, start it (it catches up from a peer) |
| ``bitrot`` | stop the leader, flip a byte in a few records and an index unit, start it |
| ``truncate`` | stop a node, cut the tail of one hour's log and index, start it |
| ``snapshot-rot`` | stop a node, flip a byte of its Raft snapshot: it must refuse to start |
|                  | (exit 4); then move its data away (its remedy) and start it empty |
| ``disk-full`` | fill the leader's disk (a tmpfs per node) to half its reserve for |
|               | ``disk_full_s``: new messages are refused, delivery goes on |
| ``power-cut`` | SIGKILL every node at once, drop every byte each had not synced |
|               | (the nodes run with ``--fsync``), start them all again |

The first round inflicts every chosen fault once, in a seeded random order; later ones are
drawn at random. Before each fault the nemesis waits for a leader that every node follows and
for every node to have applied what that leader had committed, so each fault hits a healthy
cluster, and after each it lets the cluster recover for ``interval_s``.

In a cluster of several shards each fault hits one shard's Raft group ("the leader" is that
shard's, "every node" its nodes): the next shard in turn, or, one time in three, every shard
at once (each in a thread of its own), so that two leaders fail together. Each shard's
clock faults keep one of its own clocks off at a time.
"""

from __future__ import annotations

import logging
import random
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from tickwheel.chaos import storage
from tickwheel.chaos.cluster import ChaosCluster
from tickwheel.chaos.events import EventLog, FaultEvent
from tickwheel.chaos.proxy import PARTITION_MODES
from tickwheel.chaos.workload import now_ms
from tickwheel.common.exits import EXIT_SNAPSHOT_UNREADABLE
from tickwheel.harness.local_cluster import LocalNode
from tickwheel.harness.processes import wait_for
from tickwheel.node import DEFAULT_RESERVE_BYTES

log = logging.getLogger("tickwheel.chaos")

FAULTS = ("kill", "pause", "partition", "skew", "clock-step", "restart-all", "follower-wipe",
          "bitrot", "truncate", "snapshot-rot", "disk-full", "power-cut")
AT_ONCE = 1 / 3
"""In a cluster of several shards, the share of faults that hit every shard at the same time
(the others hit one shard, each in turn)."""
STEP_TIMEOUT_S = 10.0
"""How long a node may take to obey a clock step (it looks every 0.2 s)."""
REFUSAL_TIMEOUT_S = 30.0
"""How long a node with a damaged snapshot may take to refuse to start."""


@dataclass(frozen=True, slots=True)
class NemesisConfig:
    faults: tuple[str, ...] = ("kill", "pause", "partition")
    warmup_s: float = 8.0
    """Quiet time before the first fault."""
    interval_s: float = 10.0
    """Recovery time after each fault."""
    down_s: float = 3.0
    pause_s: float = 2.5
    partition_s: float = 4.0
    max_skew_ms: int = 5_000
    clock_step_s: float = 5.0
    leader_timeout_s: float = 30.0
    disk_full_s: float = 5.0
    disk_reserve_bytes: int = DEFAULT_RESERVE_BYTES
    """The nodes' ``min_free_bytes``: ``disk-full`` leaves half of it free."""

    def __post_init__(self) -> None:
        unknown = set(self.faults) - set(FAULTS)
        if unknown or not self.faults:
            raise ValueError(f"faults must be some of {', '.join(FAULTS)}; got "
                             f"{', '.join(sorted(unknown)) or 'none'}")


class Nemesis(threading.Thread):
    """Inflicts faults on ``cluster`` until ``stop`` is set; always finishes (heals) the
    fault in progress. ``skews_ms`` is the clock offset each node was last started with."""

    def __init__(self, cluster: ChaosCluster, config: NemesisConfig, seed: int,
                 faults_log: EventLog[FaultEvent], stop: threading.Event) -> None:
        super().__init__(name="nemesis", daemon=True)
        self._cluster = cluster
        self._config = config
        self._random = random.Random(seed)
        self._randoms = [self._random] + [random.Random(seed * 1_000 + shard)
                                          for shard in range(1, len(cluster.shards))]
        """Each shard's faults draw from their own, so that faults on two shards at once
        draw apart: shard 0's is the plan's, as in a cluster of one shard."""
        self._turn = 0
        self._log = faults_log
        self._halt = stop
        self.inflicted: list[str] = []
        self.max_skew_ms = 0
        self.error: BaseException | None = None
        self._actions: dict[str, Callable[[int], tuple[LocalNode | None, str]]] = {
            "kill": self._kill, "pause": self._pause, "partition": self._partition,
            "skew": self._skew, "clock-step": self._clock_step, "restart-all": self._restart_all,
            "follower-wipe": self._follower_wipe, "bitrot": self._bitrot,
            "truncate": self._truncate, "snapshot-rot": self._snapshot_rot,
            "disk-full": self._disk_full, "power-cut": self._power_cut}

    def run(self) -> None:
        try:
            if self._halt.wait(self._config.warmup_s):
                return
            for fault in self._plan():
                self._inflict(fault)
                if self._halt.wait(self._config.interval_s):
                    return
        except BaseException as error:  # the runner reports it and fails the run
            self.error = error
            log.exception("event=nemesis_failed")

    def _plan(self) -> Iterator[str]:
        first = list(self._config.faults)
        self._random.shuffle(first)
        yield from first
        while True:
            yield self._random.choice(self._config.faults)

    def _targets(self) -> list[int]:
        """The shards the next fault hits: in a cluster of several, every shard at once one
        time in `AT_ONCE`, else the next shard in turn."""
        shards = len(self._cluster.shards)
        if shards > 1 and self._random.random() < AT_ONCE:
            return list(range(shards))
        self._turn += 1
        return [(self._turn - 1) % shards]

    def _inflict(self, fault: str) -> None:
        """``fault`` on each target shard, at the same time on several (one thread each)."""
        targets = self._targets()
        self.inflicted.append(fault)
        if len(targets) == 1:
            self._inflict_on(fault, targets[0])
            return
        with ThreadPoolExecutor(len(targets), thread_name_prefix="nemesis") as pool:
            list(pool.map(partial(self._inflict_on, fault), targets))

    def _inflict_on(self, fault: str, shard: int) -> None:
        started_ms = now_ms()
        node, detail = self._actions[fault](shard)
        ended_ms = now_ms()
        name = None if node is None else self._cluster.name(node)
        self._log.write({"fault": fault, "node": name, "shard": shard,
                         "started_ms": started_ms, "ended_ms": ended_ms, "detail": detail})
        log.info("event=fault fault=%s shard=%d node=%s took_ms=%d %s", fault, shard, name,
                 ended_ms - started_ms, detail)

    def _leader(self, shard: int) -> LocalNode:
        """The leader every running node follows, once each of them has applied what the
        leader had committed when found: a node still fetching a snapshot after the last fault
        (a wiped one took 12 s) answers nothing while it installs, and a fault then would be
        two at once (a cut-off leader and a majority that cannot answer)."""
        timeout_s = self._config.leader_timeout_s
        leader = self._cluster.leader(timeout_s, shard=shard)
        info = leader.info()
        committed = 0 if info is None else info.commit_index

        def caught_up() -> bool:
            infos = [node.info() for node in self._members(shard) if node.alive()]
            return all(info is not None and info.last_applied >= committed for info in infos)
        wait_for(caught_up, timeout_s, f"every node of shard {shard} to catch up")
        return self._cluster.leader(timeout_s, shard=shard)

    def _members(self, shard: int) -> list[LocalNode]:
        return self._cluster.shards[shard]

    def _kill(self, shard: int) -> tuple[LocalNode, str]:
        leader = self._leader(shard)
        self._cluster.kill(leader)
        time.sleep(self._config.down_s)
        self._cluster.start(leader)
        return leader, f"SIGKILL, restarted after {self._config.down_s} s"

    def _pause(self, shard: int) -> tuple[LocalNode, str]:
        leader = self._leader(shard)
        self._cluster.pause(leader)
        time.sleep(self._config.pause_s)
        self._cluster.resume(leader)
        return leader, f"SIGSTOP for {self._config.pause_s} s, then SIGCONT"

    def _partition(self, shard: int) -> tuple[LocalNode, str]:
        leader = self._leader(shard)
        mode = self._randoms[shard].choice(PARTITION_MODES)
        self._cluster.isolate(leader, mode)
        try:
            time.sleep(self._config.partition_s)
        finally:
            self._cluster.heal(shard)
        return leader, f"cut off from every peer ({mode}) for {self._config.partition_s} s"

    def _skew(self, shard: int) -> tuple[LocalNode, str]:
        self._leader(shard)
        node = self._randoms[shard].choice(self._members(shard))
        skew_ms = self._randoms[shard].choice((-1, 1)) * self._randoms[shard].randint(
            min(1_000, self._config.max_skew_ms), self._config.max_skew_ms)
        self._one_clock_off(node)
        self._cluster.stop(node)
        self._cluster.start(node, clock_skew_ms=skew_ms)
        self.max_skew_ms = max(self.max_skew_ms, abs(skew_ms))
        return node, f"restarted with its clock at {skew_ms:+d} ms"

    def _clock_step(self, shard: int) -> tuple[LocalNode, str]:
        """The leader's clock jumps while it runs (its ``--fault-injection`` obeys
        ``DATA/clock-offset-ms``), stays there for ``clock_step_s``, and jumps back to the
        offset it was started with."""
        leader = self._leader(shard)
        self._one_clock_off(leader)
        step_ms = self._randoms[shard].choice((-1, 1)) * self._randoms[shard].randint(
            min(1_000, self._config.max_skew_ms), self._config.max_skew_ms)
        leader.step_clock(step_ms, STEP_TIMEOUT_S)
        self.max_skew_ms = max(self.max_skew_ms, abs(step_ms))
        try:
            time.sleep(self._config.clock_step_s)
        finally:
            leader.step_clock(leader.clock_skew_ms, STEP_TIMEOUT_S)
        return leader, (f"clock stepped to {step_ms:+d} ms for {self._config.clock_step_s} s, "
                        f"then back to {leader.clock_skew_ms:+d} ms")

    def _one_clock_off(self, node: LocalNode) -> None:
        """Before ``node``'s clock is set off: every other node's of its shard goes back to the
        true time (live, or at its next start if it is down). A shard's time is the time a
        majority of its clocks reached (docs/replication.md), so the faults keep one clock
        off at a time: with two of three off, no design could tell the true time."""
        for other in self._members(node.shard):
            if other is node or other.clock_skew_ms == 0:
                continue
            if other.alive():
                other.step_clock(0, STEP_TIMEOUT_S)
            other.clock_skew_ms = 0

    def _restart_all(self, shard: int) -> tuple[None, str]:
        self._leader(shard)
        for node in self._members(shard):
            self._cluster.kill(node)
        for node in self._members(shard):
            self._cluster.start(node)
        return None, "SIGKILL every node, start them all again"

    def _power_cut(self, shard: int) -> tuple[None, str]:
        self._leader(shard)
        for node in self._members(shard):
            self._cluster.kill(node)
        cuts = [f"{self._cluster.name(node)}: {self._cluster.power_cut(node)}"
                for node in self._members(shard)]
        for node in self._members(shard):
            self._cluster.start(node)
        return None, f"SIGKILL every node; {'; '.join(cuts)}; started them all again"

    def _follower_wipe(self, shard: int) -> tuple[LocalNode, str]:
        leader = self._leader(shard)
        node = self._randoms[shard].choice([n for n in self._members(shard) if n is not leader])
        self._cluster.kill(node)
        self._cluster.wipe(node)
        self._cluster.start(node)
        return node, "SIGKILL, data deleted, started empty"

    def _damaged(self, node: LocalNode, damage: Callable[[Path, random.Random], str]) -> str:
        """Stop ``node``, ``damage`` its data folder, start it; what the damage was."""
        self._cluster.stop(node)
        detail = damage(node.data, self._randoms[node.shard])
        self._cluster.start(node)
        return detail

    def _bitrot(self, shard: int) -> tuple[LocalNode, str]:
        leader = self._leader(shard)
        return leader, f"stopped; {self._damaged(leader, storage.rot)}; started"

    def _truncate(self, shard: int) -> tuple[LocalNode, str]:
        self._leader(shard)
        node = self._randoms[shard].choice(self._members(shard))
        return node, f"stopped; {self._damaged(node, storage.cut)}; started"

    def _snapshot_rot(self, shard: int) -> tuple[LocalNode, str]:
        self._leader(shard)
        node = self._randoms[shard].choice(self._members(shard))
        detail = self._damaged(node, storage.rot_snapshot)
        if detail.startswith("no snapshot"):
            return node, f"stopped; {detail}; started"
        assert node.process is not None
        try:
            code = node.process.wait(REFUSAL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{self._cluster.name(node)} started on a damaged snapshot "
                               f"({detail})") from None
        if code != EXIT_SNAPSHOT_UNREADABLE:
            raise RuntimeError(f"{self._cluster.name(node)} exited {code} on a damaged "
                               f"snapshot, not {EXIT_SNAPSHOT_UNREADABLE}")
        self._cluster.wipe(node)
        self._cluster.start(node)
        return node, (f"stopped; {detail}; it refused to start (exit {code}); data moved "
                      "away, started empty")

    def _disk_full(self, shard: int) -> tuple[LocalNode, str]:
        leader = self._leader(shard)
        detail = storage.fill(leader.data, self._config.disk_reserve_bytes // 2)
        try:
            time.sleep(self._config.disk_full_s)
        finally:
            storage.empty(leader.data)
        return leader, f"{detail} for {self._config.disk_full_s} s"
