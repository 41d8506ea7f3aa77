"""Requests other threads queue for the leader, and the commands the Raft thread makes of them.

Schedules and retries are packed into entries (`tickwheel.replication.group_commit`); cancels and
reschedules are proposed one command each, in order; acks, releases, give-backs and deadline
changes of leases become one command per kind per turn; group creations and deletions one
each. What the courier reports of its consumers (joins, credits, sends, leaves) goes to the
planner, never to the log. Each queue is bounded by ``max_queued_msgs`` (`Overloaded` beyond).
Schedules, cancels and moves are written with their callers' principals (``schedule_by`` ...)
once the cluster's version has them (`PRINCIPAL_VERSION`), else without, as 0.0.4 writes them.

Requests are queued from any thread (deques and the committers are thread-safe for one
producer call and one consumer); everything else runs on the Raft thread.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from tickwheel.common.errors import Overloaded, VersionConflict
from tickwheel.common.versions import PRINCIPAL_VERSION, SHARD_MAP_VERSION, require
from tickwheel.replication import commands
from tickwheel.replication.commands import LeaseOp, LeaseRef
from tickwheel.replication.group_commit import Entry, GroupCommitter, resolve
from tickwheel.replication.handout import Planner
from tickwheel.replication.outcomes import Rejected, Retried
from tickwheel.replication.proposals import Applied, Proposals
from tickwheel.replication.state import StateMachine

HandleCommand = Callable[[int, bool], bytes]
"""A cancel or a reschedule, made into its command given the stamp and whether the cluster's
version lets it carry its principal."""
TopicCheck = Callable[[], Rejected | None]
"""Reads the topics of a request's handles and refuses the request, or lets it through."""
LeaseRequest = tuple[list[LeaseRef], list[int], Applied]


class Requests:
    def __init__(self, max_entry_bytes: int, max_queued_msgs: int,
                 wake: Callable[[], None], wake_for_schedules: Callable[[], None]) -> None:
        """``wake``: wakes the Raft thread to propose at once; ``wake_for_schedules`` does for
        schedule requests (it may leave them to a turn due soon)."""
        self._max_queued = max_queued_msgs
        self._wake = wake
        self.schedules = GroupCommitter(max_entry_bytes, max_queued_msgs, wake_for_schedules,
                                        principals=True)
        self.retries = GroupCommitter(max_entry_bytes, max_queued_msgs, wake)
        self._handle_ops: deque[tuple[HandleCommand, Applied, TopicCheck | None]] = deque()
        self._lease_ops: dict[LeaseOp, deque[LeaseRequest]] = {op: deque() for op in LeaseOp}
        self._group_ops: deque[tuple[bool, str, str, Applied]] = deque()
        self._map_ops: deque[tuple[int, bytes, Applied]] = deque()
        self._map_version = 0
        """The newest shard map version proposed by this leader: schedules placed by an
        older one are refused from then on (`GroupCommitter.drain`)."""
        self._consumer_ops: deque[Callable[[Planner], None]] = deque()

    # -- any thread -------------------------------------------------------------------------

    def handle_op(self, command: HandleCommand, check: TopicCheck | None) -> Applied:
        future: Applied = Future()
        if len(self._handle_ops) >= self._max_queued:
            raise Overloaded("max_queued_msgs")
        self._handle_ops.append((command, future, check))
        self._wake()
        return future

    def lease_op(self, op: LeaseOp, leases: Sequence[LeaseRef],
                 deadlines_ms: Sequence[int] = (), wake: bool = True) -> Applied:
        """Queue a change of leases; ``wake`` to propose it now rather than at the next
        turn."""
        future: Applied = Future()
        if len(self._lease_ops[op]) >= self._max_queued:
            raise Overloaded("max_queued_msgs")
        self._lease_ops[op].append((list(leases), list(deadlines_ms), future))
        if wake:
            self._wake()
        return future

    def group_op(self, create: bool, topic: str, name: str) -> Applied:
        future: Applied = Future()
        self._group_ops.append((create, topic, name, future))
        self._wake()
        return future

    def map_op(self, version: int, body: bytes) -> Applied:
        future: Applied = Future()
        self._map_ops.append((version, body, future))
        self._wake()
        return future

    def consumer_op(self, op: Callable[[Planner], None], wake: bool = True) -> None:
        """A report for the planner, read at the next turn; ``wake`` to make that turn now."""
        self._consumer_ops.append(op)
        if wake:
            self._wake()

    @property
    def consumer_ops_queued(self) -> bool:
        return bool(self._consumer_ops)

    @property
    def idle(self) -> bool:
        """Nothing is queued (any thread may be queueing as this is read: see
        `RaftPort.wake`)."""
        return not (self.schedules.queued_msgs or self.retries.queued_msgs or self._handle_ops
                    or self._group_ops or self._map_ops or self._consumer_ops
                    or any(self._lease_ops.values()))

    def leave(self, key: int) -> None:
        """The consumer's stream closed: its leases are released, or given back (those
        whose messages were never sent)."""
        def leave(planner: Planner) -> None:
            sent, unsent = planner.leave(key)
            for op, leases in ((LeaseOp.RELEASE, sent), (LeaseOp.RETURN, unsent)):
                if leases:
                    self._lease_ops[op].append((leases, [], Future()))
        self.consumer_op(leave)

    # -- the Raft thread --------------------------------------------------------------------

    def propose(self, now_ms: int, proposals: Proposals, planner: Planner | None,
                state: StateMachine) -> None:
        """Make commands of everything queued, and propose them. A new shard map goes after
        the schedules queued before it, and later ones placed by an older map are refused."""
        applied_map = 0 if state.shard_map is None else state.shard_map.version
        self._map_version = max(self._map_version, applied_map)
        by = state.cluster_version >= PRINCIPAL_VERSION  # never unset once finalized
        for entry in self.schedules.drain(self._map_version):
            proposals.propose(commands.schedule(now_ms, entry.parts, entry.runs() if by else None),
                              entry)
        while self._map_ops:
            version, body, future = self._map_ops.popleft()
            try:  # the version may have been finalized since it was queued, never unset
                require(state.cluster_version, SHARD_MAP_VERSION, "a shard map change")
            except VersionConflict as error:
                resolve(future, error=error)
                continue
            self._map_version = max(self._map_version, version)
            proposals.propose(commands.shard_map(now_ms, version, body), future)
        for entry in self.retries.drain():
            proposals.propose(commands.retry(now_ms, entry.parts),
                              self._retry_applied(entry, planner, state))
        while self._handle_ops:
            command, future, check = self._handle_ops.popleft()
            refused = None if check is None else check()
            if refused is not None:
                resolve(future, result=[refused])
                continue
            proposals.propose(command(now_ms, by), future)
        while self._group_ops:
            create, topic, name, future = self._group_ops.popleft()
            proposals.propose(commands.group(now_ms, create, topic, name), future)
        for op, queue in self._lease_ops.items():
            if queue:
                self._propose_lease_op(now_ms, op, queue, proposals, planner, state)
        for _ in range(len(self._consumer_ops)):
            report = self._consumer_ops.popleft()
            if planner is not None:
                report(planner)

    def refuse_writes(self, error: BaseException) -> None:
        """Not leading: schedules and retries queued meanwhile fail with ``error``."""
        for committer in (self.schedules, self.retries):
            if committer.queued_msgs:
                committer.fail_all(error)

    def fail_all(self, error: BaseException) -> None:
        """Leadership ended: every queued request gets ``error``; consumer reports are
        dropped with the planner they were for."""
        self.schedules.fail_all(error)
        self.retries.fail_all(error)
        while self._handle_ops:
            resolve(self._handle_ops.popleft()[1], error=error)
        for queue in self._lease_ops.values():
            while queue:
                resolve(queue.popleft()[2], error=error)
        while self._group_ops:
            resolve(self._group_ops.popleft()[3], error=error)
        while self._map_ops:
            resolve(self._map_ops.popleft()[2], error=error)
        self._map_version = 0  # the next term's leader starts from what it applied
        self._consumer_ops.clear()

    def _propose_lease_op(self, now_ms: int, op: LeaseOp, queue: deque[LeaseRequest],
                          proposals: Proposals, planner: Planner | None,
                          state: StateMachine) -> None:
        """One command for every queued request of ``op``; each request gets its slice of
        the results."""
        requests = [queue.popleft() for _ in range(len(queue))]
        leases = [lease for lease_list, _, _ in requests for lease in lease_list]
        deadlines = [d for _, deadline_list, _ in requests for d in deadline_list]
        combined: Applied = Future()

        def split(done: Applied) -> None:
            error = done.exception()
            results = None if error is not None else done.result()
            if results is not None and op is not LeaseOp.EXTEND:
                _lease_ended(planner, state, leases, results)
            if results is not None and op is LeaseOp.EXTEND and planner is not None:
                for lease, deadline, took in zip(leases, deadlines, results, strict=True):
                    if took:
                        planner.watch(deadline, lease.group_id, lease.handle, lease.seq)
            start = 0
            for lease_list, _, future in requests:
                end = start + len(lease_list)
                resolve(future, None if results is None else results[start:end], error)
                start = end
        combined.add_done_callback(split)
        proposals.propose(commands.leases(now_ms, op, leases, deadlines), combined)

    @staticmethod
    def _retry_applied(entry: Entry, planner: Planner | None, state: StateMachine) -> Applied:
        """The retry entry, settled after the planner learns which leases it ended."""
        future: Applied = Future()
        leases = [commands.read_retry_lease(part) for part in entry.parts]

        def settle(done: Applied) -> None:
            error = done.exception()
            results = None if error is not None else done.result()
            if results is not None:
                _lease_ended(planner, state, leases,
                             [isinstance(r, Retried) and r.handle is not None for r in results])
            entry.settle(results, error)
        future.add_done_callback(settle)
        return future


def _lease_ended(planner: Planner | None, state: StateMachine, leases: list[LeaseRef],
                 results: list[bool]) -> None:
    """Tell the planner which of ``leases`` ended (their messages are done or retried)."""
    if planner is None:
        return
    for lease, took in zip(leases, results, strict=True):
        group = state.groups.by_id(lease.group_id)
        if took and group is not None:
            planner.resolved(lease.group_id, lease.handle, group.topic, group.name)
