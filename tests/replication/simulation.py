"""A seeded simulation of a tickwheel cluster in one process: real `Replica`s (real `StateMachine`
files, real dispatch and hand-over logic) on a simulated Raft port and a simulated clock.

Everything that varies comes from one ``random.Random(seed)``: due times, when leaders change,
which uncommitted entries survive a change, partitions of the leader, clock skews, how slowly
consumers acknowledge. Time jumps to the next thing that can happen (a replica's wake-up, an
acknowledgement, a fault), so a run of a few simulated seconds takes milliseconds. A run ends by
healing everything, letting one leader drain what is due, and checking what the chaos audit
checks: nothing acknowledged is lost, every repeated delivery is flagged, nothing is delivered
before its due time, and cancels and reschedules sent close to the due time (through leader
changes) mean what they answered: nothing answered ``CANCELLED`` is ever delivered, a message
answered ``RESCHEDULED`` only at its new time, one answered ``HANDED_OUT`` only at its old one.
A failure names its seed; `run(seed)` replays it exactly.

The simulated Raft port and clock are in `sim_raft`.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import NoReturn

from sim_raft import NodeClock, SimCluster, SimRaft, World

from tickwheel.replication import commands
from tickwheel.replication.config import ReplicaConfig
from tickwheel.replication.dispatcher import Delivery, Expired
from tickwheel.replication.group import DEFAULT_GROUP, STREAM
from tickwheel.replication.handout import ConsumerSlot
from tickwheel.replication.outcomes import Accepted, Moved, MoveOutcome
from tickwheel.replication.replica import Replica
from tickwheel.wheel import CancelResult, Cursor, NewMessage

PRODUCER_RETRY_S = 0.1
"""A producer whose request failed tries again this much later, with the same ids."""
CREDITS = 1_000
VISIBILITY_MS = 600_000


LEAD_MS = ReplicaConfig().dispatch.slow_lead_ms
"""How long before its due time a replica may hand a delivery to its sink (a slow rate's
steps take the furthest ahead)."""


class RecordingSink:
    """A replica's `DeliverySink` and its consumer: once the replica dispatches, one consumer
    joins the default group; every delivery is recorded and acknowledged after a random delay
    (lost if it reaches a node that no longer leads)."""

    def __init__(self, run: Run, address: str) -> None:
        self._run = run
        self._address = address
        self.replica: Replica | None = None

    def dispatch_started(self, term: int, epoch: int, cursor: Cursor, takeover_ms: int) -> None:
        self._run.consumer_key += 1
        self.replica.join(ConsumerSlot(self._run.consumer_key, "orders", DEFAULT_GROUP,
                                       CREDITS, VISIBILITY_MS, STREAM))

    def deliver(self, deliveries: list[Delivery]) -> None:
        run = self._run
        for delivery in deliveries:
            message = delivery.message
            run.deliveries.append((message.id, delivery.possible_duplicate, run.world.wall_ms,
                                   message.deliver_at_ms, self._address))
            run.leases_seen.append((message.id, message.handle, delivery.lease.seq))
            ack_s = run.world.now_s + run.rng.choice((0.0, 0.01, 0.2, 1.5))
            run.acks.append((ack_s, self._address, delivery.lease))
        self.replica.credit(deliveries[0].consumer, len(deliveries))

    def expired(self, leases: list[Expired]) -> None:
        pass  # VISIBILITY_MS outlasts every scenario

    def dispatch_stopped(self, epoch: int) -> None:
        pass


class Run:
    """One seeded scenario."""

    def __init__(self, seed: int, root: Path, members: int = 3, duration_s: float = 3.0,
                 skews_ms: tuple[int, ...] | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.world = World()
        self.cluster = SimCluster(self.world, self.rng)
        self.duration_s = duration_s
        self.addresses = [f"n{i}" for i in range(members)]
        self.clocks = {a: NodeClock(self.world, self.rng.choice((0, 0, 300, -300, 1_500))
                                    if skews_ms is None else skews_ms[i])
                       for i, a in enumerate(self.addresses)}
        self.cluster.clocks = self.clocks
        skews = sorted((clock.skew_ms for clock in self.clocks.values()), reverse=True)
        self.majority_ahead_ms = max(0, skews[members // 2])
        """How far ahead of the true time a majority of clocks runs: how early a message may
        be handed out (`tickwheel.replication.cluster_clock`)."""
        self.deliveries: list[tuple[str, bool, int, int, str]] = []
        self.acks: list[tuple[float, str, commands.LeaseRef]] = []
        self.leases_seen: list[tuple[str, int, int]] = []
        """(id, handle, lease number) of every delivery."""
        self.consumer_key = 0
        self.scheduled: dict[str, int] = {}
        """Id -> due time, for every schedule the cluster acknowledged."""
        self.handles: dict[str, int] = {}
        self._changes: list[tuple[Future, str, list[str], int, str]] = []
        """Cancels and reschedules in flight: (future, "cancel" or "move", ids, new due, the
        node asked)."""
        self.changed: set[str] = set()
        """Ids a cancel or a reschedule was sent for (one each)."""
        self.cancelled: set[str] = set()
        """Answered CANCELLED: never to be delivered."""
        self.unsure: set[str] = set()
        """A cancel whose answer was lost: delivered or not, either is right."""
        self.due_now: dict[str, int] = {}
        """Answered RESCHEDULED (the new time) or HANDED_OUT (the old one): every delivery of
        the id must carry this due time."""
        self._next_id = 0
        self._requests: list[tuple[Future, list[NewMessage]]] = []
        self._retries: list[tuple[float, list[NewMessage]]] = []
        """Requests that failed, and when their producer tries again (same ids)."""
        self.crashed: set[str] = set()
        self.deaths = 0
        self.restarts = 0
        """Replicas that stopped themselves (exit 70 in a real node): a state they could not
        trust, or a snapshot they could not install."""
        self._root = root
        self.replicas = {a: self._replica(a, root / a) for a in self.addresses}

    def _replica(self, address: str, data: Path) -> Replica:
        def raft(_address: str, _peers: list[str], raft_dir: Path, _config: object,
                 apply: Callable[[bytes], object], snapshot: tuple, wall_ms: object,
                 prefetch: object, taking: object) -> SimRaft:
            node = SimRaft(self.cluster, address, raft_dir, apply, snapshot)
            self.cluster.nodes[address] = node
            return node
        peers = [a for a in self.addresses if a != address]
        sink = RecordingSink(self, address)
        replica = Replica(address, peers, data, sink, fetch=self._fetch,
                          clock=self.clocks[address], config=ReplicaConfig(), raft=raft,
                          die=_raise_died)
        sink.replica = replica
        return replica

    def _fetch(self, peers: list[str], path: str, offset: int, size: int) -> bytes:
        """What the node's `PeerFiles` does over gRPC: the bytes from the first peer that has
        them all."""
        for peer in peers:
            if peer in self.crashed:
                continue
            try:
                data = self.replicas[peer].read_state_file(path, offset, size)
            except OSError:
                continue  # it may be behind; another may have it
            if len(data) == size:
                return data
        raise OSError(f"no peer has {path} [{offset}, {offset + size})")

    # -- the scenario -----------------------------------------------------------------------

    def run(self) -> list[str]:
        """Play the scenario; the violations found (empty: clean)."""
        self.cluster.elect(self.rng.choice(self.addresses))
        wake_s = {a: 0.0 for a in self.addresses}
        next_fault_s = self.rng.uniform(0.2, 1.0)
        next_load_s = 0.0
        next_change_s = self.rng.uniform(0.1, 0.5)
        while self.world.now_s < self.duration_s + 6.0:
            now_s = self.world.now_s
            producing = now_s < self.duration_s
            if producing and now_s >= next_load_s:
                self._schedule_some()
                next_load_s = now_s + self.rng.choice((0.05, 0.2, 0.7))
            if producing and now_s >= next_change_s:
                self._change_some()
                next_change_s = now_s + self.rng.choice((0.01, 0.05, 0.3))
            if producing and now_s >= next_fault_s:
                self._fault()
                next_fault_s = now_s + self.rng.uniform(0.2, 1.0)
            if not producing and (self.cluster.isolated or self.cluster.leader is None):
                self._heal()
            if not producing and self._drained():
                break
            self._deliver_acks()
            self._resubmit()
            self.cluster.replicate()
            for address, replica in self.replicas.items():
                if wake_s[address] <= now_s and address not in self.crashed:
                    try:
                        wake_s[address] = now_s + replica.turn(0.0)
                    except NodeDied:
                        self.deaths += 1
                        self._crash(address)
            self.cluster.replicate()
            self._settle_requests()
            self._settle_changes()
            times = [now_s + 0.05]
            times += [wake for address, wake in wake_s.items() if address not in self.crashed]
            times += [ack_s for ack_s, *_ in self.acks]
            times += [retry_s for retry_s, _ in self._retries]
            if producing:
                times += [next_load_s, next_fault_s, next_change_s]
            self.world.now_s = max(now_s + 0.001, min(times))
        return self._violations()

    def _drained(self) -> bool:
        """Everything acknowledged was delivered, and nothing is still being asked."""
        delivered = {delivery[0] for delivery in self.deliveries}
        return (not self._requests and not self._retries and not self._changes
                and delivered.issuperset(self.scheduled.keys() - self.cancelled - self.unsure))

    def _schedule_some(self) -> None:
        leader = self.cluster.leader
        replica = self.replicas.get(leader) if leader else None
        count = self.rng.randint(1, 8)
        messages = []
        for _ in range(count):
            self._next_id += 1
            due_ms = self.world.wall_ms + self.rng.choice((-2_000, 0, 5, 300, 1_000, 2_000))
            messages.append(NewMessage(f"m{self._next_id}", "orders", b"x", due_ms))
        self._submit(replica, messages)

    def _submit(self, replica: Replica | None, messages: list[NewMessage]) -> None:
        if replica is not None and replica.is_leader():
            try:
                self._requests.append((replica.schedule(messages), messages))
                return
            except Exception:  # NotLeader, Overloaded: the producer retries
                pass
        self._retries.append((self.world.now_s + PRODUCER_RETRY_S, messages))

    def _resubmit(self) -> None:
        due = [messages for retry_s, messages in self._retries if retry_s <= self.world.now_s]
        self._retries = [(retry_s, messages) for retry_s, messages in self._retries
                         if retry_s > self.world.now_s]
        leader = self.cluster.leader
        for messages in due:
            self._submit(self.replicas.get(leader) if leader else None, messages)

    def _settle_requests(self) -> None:
        """Record what was acknowledged; retry, with the same ids, what failed."""
        waiting, self._requests = self._requests, []
        for future, messages in waiting:
            if not future.done():
                self._requests.append((future, messages))
            elif future.exception() is not None:
                self._retries.append((self.world.now_s + PRODUCER_RETRY_S, messages))
            else:
                for message, result in zip(messages, future.result(), strict=True):
                    if isinstance(result, Accepted):
                        self.scheduled[message.id] = result.deliver_at_ms
                        self.handles[message.id] = result.handle

    def _change_some(self) -> None:
        """A user's cancel or reschedule of a few messages due about now (the race)."""
        wall_ms = self.world.wall_ms
        near = [i for i, due in self.scheduled.items()
                if i not in self.changed and -30 <= due - wall_ms <= 60]
        chosen = self.rng.sample(near, min(len(near), self.rng.randint(1, 4)))
        leader = self.cluster.leader
        replica = self.replicas.get(leader) if leader else None
        if not chosen or replica is None or not replica.is_leader():
            return
        kind = self.rng.choice(("cancel", "move"))
        new_due_ms = wall_ms + self.rng.choice((-500, 0, 400, 1_500))
        handles = [self.handles[i] for i in chosen]
        try:
            future = (replica.cancel(handles) if kind == "cancel"
                      else replica.reschedule([(h, new_due_ms) for h in handles]))
        except Exception:  # NotLeader, Overloaded: the user was told no; nothing changed
            return
        self.changed.update(chosen)
        self._changes.append((future, kind, chosen, new_due_ms, leader))

    def _settle_changes(self) -> None:
        waiting, self._changes = self._changes, []
        for future, kind, ids, new_due_ms, asked in waiting:
            if not future.done() and asked not in self.crashed:
                self._changes.append((future, kind, ids, new_due_ms, asked))
            elif not future.done() or future.exception() is not None:
                # failed, or its node died before it could answer (the entry may have
                # committed all the same): committed or not, nobody can tell
                if kind == "cancel":
                    self.unsure.update(ids)
            else:
                for message_id, outcome in zip(ids, future.result(), strict=True):
                    self._answered(message_id, kind, outcome, new_due_ms)

    def _answered(self, message_id: str, kind: str, outcome: object, new_due_ms: int) -> None:
        if outcome in (CancelResult.CANCELLED, CancelResult.ALREADY_CANCELLED):
            self.cancelled.add(message_id)
        elif isinstance(outcome, Moved) and outcome.outcome is MoveOutcome.RESCHEDULED:
            self.due_now[message_id] = new_due_ms
        elif isinstance(outcome, Moved) and outcome.outcome is MoveOutcome.HANDED_OUT:
            self.due_now[message_id] = self.scheduled[message_id]

    def _fault(self) -> None:
        cluster, rng = self.cluster, self.rng
        roll = rng.random()
        if roll < 0.3 and cluster.leader is not None and not cluster.isolated:
            cluster.isolated.add(cluster.leader)  # the leader is cut off (or paused)
        elif roll < 0.45 and not self.crashed:
            self._crash(rng.choice(self.addresses))
        elif roll < 0.6:
            live = [a for a in self.addresses if a not in cluster.isolated]
            if live:
                cluster.nodes[rng.choice(live)].take_snapshot()
        elif roll < 0.85 and cluster.can_elect():
            candidates = [a for a in self.addresses if a not in cluster.isolated]
            cluster.elect(rng.choice(candidates))
        else:
            self._heal()

    def _crash(self, address: str) -> None:
        """SIGKILL (or exit 70): nothing flushed, nothing said; restarted at the next heal."""
        self.crashed.add(address)
        self.cluster.isolated.add(address)
        _kill(self.replicas[address])

    def _restart(self, address: str) -> None:
        """The crashed node starts again on its files; a node without a snapshot of its own
        is sent a peer's (pysyncobj streams the leader's to a follower that needs it)."""
        own = self._root / address / "raft" / "snapshot"
        donors = [self._root / a / "raft" / "snapshot" for a in self.addresses
                  if a != address and a not in self.crashed]
        donors = [path for path in donors if path.exists()]
        if donors and (not own.exists() or self.rng.random() < 0.5):
            own.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.rng.choice(donors), own)
        self.crashed.discard(address)
        self.restarts += 1
        self.replicas[address] = self._replica(address, self._root / address)

    def _heal(self) -> None:
        for address in sorted(self.crashed):
            self._restart(address)
        self.cluster.heal()
        if self.cluster.can_elect() and (self.cluster.leader is None or self.rng.random() < 0.5):
            self.cluster.elect(self.rng.choice(self.addresses))

    def _deliver_acks(self) -> None:
        now_s = self.world.now_s
        due = [ack for ack in self.acks if ack[0] <= now_s]
        self.acks = [ack for ack in self.acks if ack[0] > now_s]
        for _, address, lease in due:
            replica = self.replicas[address]
            if address not in self.cluster.isolated and replica.is_leader():
                replica.ack([lease])

    # -- the verdict ------------------------------------------------------------------------

    def _violations(self) -> list[str]:
        found = []
        by_id: dict[str, list[tuple[bool, int, int, str]]] = defaultdict(list)
        for message_id, flagged, at_ms, due_ms, node in self.deliveries:
            by_id[message_id].append((flagged, at_ms, due_ms, node))
            # the sink waits for the due time (the courier does); at_ms is the true time
            if at_ms + LEAD_MS + self.majority_ahead_ms < due_ms:
                found.append(f"{message_id} handed out early by {node}: {at_ms} < {due_ms} "
                             f"- {LEAD_MS} ms - {self.majority_ahead_ms} ms")
        lost = sorted(self.scheduled.keys() - by_id.keys() - self.cancelled - self.unsure)
        for message_id in sorted(self.cancelled & by_id.keys()):
            found.append(f"{message_id} delivered though a cancel answered CANCELLED: "
                         f"{by_id[message_id]}")
        for message_id, due_ms in sorted(self.due_now.items()):
            wrong = [entry for entry in by_id.get(message_id, []) if entry[2] != due_ms]
            if wrong:
                found.append(f"{message_id} delivered due at another time than its reschedule "
                             f"answered ({due_ms}): {wrong}")
        if lost:
            found.append(f"lost: {lost[:10]} ({len(lost)} in all)")
        for message_id, seen in by_id.items():
            unflagged = [entry for entry in seen[1:] if not entry[0]]
            if unflagged:
                found.append(f"{message_id} delivered {len(seen)} times, "
                             f"{len(unflagged)} repeats unflagged: {seen}")
        granted = self._committed_grants()
        first_seen: set[str] = set()
        for (message_id, flagged, *_), (_, handle, _) in zip(self.deliveries, self.leases_seen,
                                                             strict=True):
            if flagged and message_id not in first_seen and granted[handle] < 2:
                found.append(f"{message_id} flagged on its first delivery, but the log holds "
                             f"{granted[handle]} lease(s) of it")
            first_seen.add(message_id)
        return found

    def _committed_grants(self) -> Counter:
        """How many leases the committed log granted per handle (a grant may find the
        message leased already; counted anyway, so this is an upper bound)."""
        granted: Counter = Counter()
        for _, command in self.cluster.log[:self.cluster.commit]:
            if commands.read_header(command)[0] is commands.Kind.HANDOUT:
                granted.update(grant[0] for grant in commands.read_handout(command).grants)
        return granted

    def summary(self) -> Counter:
        """How much happened: deliveries, acknowledged schedules, terms, flagged deliveries,
        and flagged first deliveries (false alarms: issue 16 wants them gone)."""
        counts: Counter = Counter(delivered=len(self.deliveries), scheduled=len(self.scheduled),
                                  terms=self.cluster.term, deaths=self.deaths,
                                  restarts=self.restarts)
        counts["flagged"] = sum(1 for d in self.deliveries if d[1])
        counts["cancelled"] = len(self.cancelled)
        counts["rescheduled"] = sum(1 for i, due in self.due_now.items()
                                    if due != self.scheduled[i])
        seen: set[str] = set()
        for message_id, flagged, *_ in self.deliveries:
            counts["false_alarms"] += flagged and message_id not in seen
            seen.add(message_id)
        return counts

    def close(self) -> None:
        for address, replica in self.replicas.items():
            if address not in self.crashed:
                replica.stop()


class NodeDied(Exception):
    """A replica called its ``die`` (a real node exits with 70 and is restarted)."""


def _raise_died(address: str, reason: str, code: int) -> NoReturn:
    """Exit 70 (or 3, 74) would end the simulation; the node is crashed and restarted."""
    raise NodeDied(f"{address} exit {code}: {reason}")


def _kill(replica: Replica) -> None:
    """What SIGKILL leaves of a replica: its files as written so far (buffered appends and the
    cursor's meta are lost) and no lock; the process's other handles die with the object."""
    meta = replica._state.wheel._meta
    if not meta.closed:
        meta.close()  # and so close() of the dead wheel writes nothing


def run(seed: int, duration_s: float = 3.0) -> tuple[list[str], Counter]:
    """One scenario from ``seed``: its violations and a summary."""
    with tempfile.TemporaryDirectory(prefix=f"tickwheel-sim-{seed}-",
                                     dir=_fast_tmp()) as root:
        scenario = Run(seed, Path(root), duration_s=duration_s)
        try:
            return scenario.run(), scenario.summary()
        finally:
            scenario.close()


def _fast_tmp() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() else None


if __name__ == "__main__":
    import sys

    for text in sys.argv[1:]:
        found, counts = run(int(text))
        print(f"seed {text}: {dict(counts)}")
        for violation in found:
            print(f"  {violation}")
