"""What a replica does while it leads: the barrier, dispatch under its tenure, the cursor.

A new leader proposes a *barrier* (a cursor command that moves nothing); once it is applied,
every entry of earlier terms is applied too, and dispatch starts from the replicated cursor.
The first leader of a new cluster (no handle key yet) also proposes this build's cluster
version (`tickwheel.common.versions`): an upgraded cluster waits for ``upgrade finalize``.
While its tenure holds (`tickwheel.replication.raft.tenure`), a step comes when the first
message not yet taken is due within ``min_lead_ms``; it takes what comes due by ``now +
lead_ms`` from the wheel (by ``now + slow_lead_ms`` if that is few) and proposes one
*handout*: those messages readied for their consumer groups, and leases granted to consumers
with credits (`tickwheel.replication.handout`); once it is applied, the granted messages go to
the sink. Leases whose deadline passed go to the sink to be retried. Every ``cursor_sync_ms``
the cursor is proposed if it moved. A node that stops leading ends dispatch at once, and every
request and proposal still waiting fails with `NotLeader`.

Single-threaded (the Raft thread), but for `may_deliver`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import Future

from tickwheel.common.errors import CorruptSegment, NotLeader, UnknownHandle
from tickwheel.common.versions import CURRENT
from tickwheel.replication import commands
from tickwheel.replication.cluster_clock import ClusterClock
from tickwheel.replication.commands import HANDLE_KEY_BYTES
from tickwheel.replication.config import ReplicaConfig
from tickwheel.replication.dispatcher import DeliverySink, Dispatcher
from tickwheel.replication.handout import Planner
from tickwheel.replication.proposals import Applied, Proposals
from tickwheel.replication.raft import RaftPort
from tickwheel.replication.requests import Requests
from tickwheel.replication.state import StateMachine
from tickwheel.wheel import Cursor, DueMessage

log = logging.getLogger("tickwheel.replication")

DAMAGE_RETRY_S = 1.0
"""How long the dispatch waits before asking again for a copy of damaged bytes it holds at."""
BLOCKED_WAIT_S = 0.002
"""How long the Raft thread waits for sockets while taking waits for handouts to apply."""
PACED_LOG_MS = 60_000
PACED_LOG_TOPICS = 1_024
"""`event=topic_paced` comes at most once a minute per topic (of this many remembered)."""


class Leadership:
    def __init__(self, config: ReplicaConfig, raft: RaftPort, state: StateMachine,
                 clock: ClusterClock, sink: DeliverySink, proposals: Proposals, requests: Requests,
                 leader_hint: Callable[[], str | None]) -> None:
        self._config = config
        self._raft = raft
        self._state = state
        self._clock = clock
        self._sink = sink
        self._proposals = proposals
        self._requests = requests
        self._leader_hint = leader_hint
        self.dispatcher = Dispatcher(config.dispatch)
        self.term: int | None = None
        """The term this node leads in; None while it does not lead."""
        self.planner: Planner | None = None
        self._tenure_until_s = 0.0
        self._proposed_cursor: Cursor | None = None
        self._last_cursor_sync = 0.0
        self._next_dispatch_s = 0.0
        self._paced_logged: dict[str, int] = {}
        self.settled = False
        """Whether the last step's answer holds until its time if nothing changes: not while
        a new leader waits for its barrier or for its tenure, which answers may bring any
        turn."""
        self.steps_next = False
        """Whether the last step's answer is the time of the next dispatch step (messages
        come due then), rather than of a cursor sync, a lease deadline or a heartbeat."""

    def may_deliver(self) -> bool:
        """Whether this node still holds its tenure (any thread)."""
        return self._clock.monotonic_s() < self._tenure_until_s

    def follow(self) -> None:
        """Notice a leadership won or lost since the last turn."""
        leading = self._raft.is_leader()
        term = self._raft.term()
        if self.term is not None and (not leading or term != self.term):
            self.end()
        if leading and self.term is None:
            self.term = term
            self._proposed_cursor = None
            self.planner = Planner(self._config.dispatch, 0)
            key = os.urandom(HANDLE_KEY_BYTES) if self._state.handle_key is None else None
            # the barrier moves neither the cursor nor the stamp: a new leader has heard no
            # clock but its own yet (`ClusterClock`), and stamps only move forward
            barrier = commands.barrier(self._state.stamp_ms, self._state.cursor, key)
            self._proposals.propose(barrier, self._barrier_applied(term))
            if key is not None:  # a new cluster's first leader: no older member to wait for
                self._proposals.propose(commands.finalize(self._state.stamp_ms, CURRENT),
                                        Future())
            log.info("event=leadership_won term=%d cursor_second=%d cursor_local_index=%d",
                     term, *self._state.cursor)

    def end(self) -> None:
        log.info("event=leadership_lost term=%s dispatched_epoch=%d", self.term,
                 self.dispatcher.epoch)
        self.term = None
        self.settled = False
        self.steps_next = False
        self._tenure_until_s = 0.0
        self._sink.dispatch_stopped(self.dispatcher.epoch)
        self.dispatcher.end()
        self.planner = None
        error = NotLeader(self._leader_hint())
        self._requests.fail_all(error)
        self._proposals.fail_all(error)

    def renew_tenure(self) -> None:
        """Read the tenure from the answers heard so far (`may_deliver`); none while the
        members' clocks are not known (`ClusterClock.agreed`)."""
        self._tenure_until_s = (self._raft.tenure_until_s(self._config.raft.tenure_ms)
                                if self._clock.agreed() else 0.0)

    def step(self, now_ms: int) -> float:
        """Dispatch what comes due, under its tenure; returns how long the poller may sleep."""
        self.renew_tenure()
        self.settled = (self.dispatcher.active
                        and self._clock.monotonic_s() < self._tenure_until_s)
        self.steps_next = False
        if not self.settled:
            return self._config.raft.heartbeat_ms / 1000
        self._pace(now_ms)
        taken, lead_until_ms = self._take_due(now_ms)
        self._hand_out(taken, now_ms, lead_until_ms)
        self._sync_cursor(now_ms)
        return self._sleep_s(now_ms, len(taken))

    def _barrier_applied(self, term: int) -> Applied:
        future: Applied = Future()

        def start_dispatch(done: Applied) -> None:
            if done.exception() is None and self.term == term:
                takeover_ms = self._clock.now_ms()
                self.dispatcher.begin(self._state.wheel, self._state.readied)
                planner = self.planner
                if planner is not None:
                    planner.epoch = self.dispatcher.epoch
                    for group in self._state.groups:
                        for handle, lease in group.leases.items():
                            planner.watch(lease.deadline_ms, group.id, handle, lease.seq)
                self._sink.dispatch_started(term, self.dispatcher.epoch, self._state.cursor,
                                            takeover_ms)
                log.info("event=dispatch_started term=%d takeover_ms=%d cursor_second=%d "
                         "cursor_local_index=%d readied_past_cursor=%d", term, takeover_ms,
                         *self._state.cursor, self._state.readied_past_cursor)
        future.add_done_callback(start_dispatch)
        return future

    def _hand_out(self, taken: list[DueMessage], now_ms: int, lead_until_ms: int) -> None:
        """Propose one handout of what comes due by ``lead_until_ms`` and the leases to grant;
        once it is applied, the sink gets the granted messages (to send each at its due
        time). Expired leases go to the sink too."""
        planner = self.planner
        if planner is None:
            return
        groups = self._state.groups
        plan = planner.plan(groups, taken, now_ms, lead_until_ms, self._read)
        if plan.ready or plan.grants:
            future: Applied = Future()
            epoch = self.dispatcher.epoch

            def applied(done: Applied) -> None:
                if self.dispatcher.epoch != epoch or self.planner is not planner:
                    return
                self.dispatcher.applied([item.topic for item in plan.ready])
                if done.exception() is not None:
                    planner.failed(plan)
                    return
                deliveries = planner.granted(plan, done.result(), groups)
                if deliveries:
                    self._sink.deliver(deliveries)
            future.add_done_callback(applied)
            self._proposals.propose(commands.handout(now_ms, plan.ready, plan.grants), future)
        expired = planner.expired(groups, now_ms, self._read)
        if expired:
            self._sink.expired(expired)

    def _pace(self, now_ms: int) -> None:
        """Park the topics one of whose read groups (`Planner.reading`) holds
        ``max_ready_ahead_msgs`` ready or on their way to it, until it is down to half: their
        messages wait in the wheel (`Wheel.park`), the other topics' go on. Topics past
        ``max_tracked_topics`` share one tag and are never parked: their groups keep at most
        ``max_ready_msgs``."""
        planner = self.planner
        if planner is None:
            return
        wheel, groups, pending = self._state.wheel, self._state.groups, self._state.pending
        ahead = self._config.dispatch.max_ready_ahead_msgs
        unapplied = self.dispatcher.unapplied_by_topic
        parked = wheel.parked
        tags: set[int] = set()
        for topic, name in planner.reading(now_ms):
            tag = pending.tag_of(topic)
            if tag is None:
                continue
            # a topic's default group appears with its first handout's apply: until then
            # what is on its way counts alone (steps follow each other faster under a burst)
            group = groups.get(topic, name)
            level = (0 if group is None else len(group.ready)) + unapplied.get(topic, 0)
            if level >= ahead or (tag in parked and level >= ahead // 2):
                tags.add(tag)
                if tag not in parked:
                    self._paced(topic, name, level, now_ms)
        if tags != parked:
            wheel.park(frozenset(tags))

    def _paced(self, topic: str, group: str, level: int, now_ms: int) -> None:
        """Say when a topic starts waiting for its consumers (at most every `PACED_LOG_MS`
        per topic: a burst waits and goes on every few thousand messages)."""
        if now_ms - self._paced_logged.get(topic, -PACED_LOG_MS) >= PACED_LOG_MS:
            self._paced_logged[topic] = now_ms
            log.info("event=topic_paced topic=%s group=%r ready=%d max_ready_ahead_msgs=%d "
                     "reason=%r", topic, group, level,
                     self._config.dispatch.max_ready_ahead_msgs,
                     "its consumers are behind: its messages wait in the wheel")
            if len(self._paced_logged) > PACED_LOG_TOPICS:
                self._paced_logged.clear()

    def _read(self, handle: int) -> DueMessage | None:
        """A ready message's body, from the wheel (None, logged, if it cannot be read)."""
        try:
            return self._state.wheel.handles.read(handle)[0]
        except (UnknownHandle, CorruptSegment) as error:
            log.error("event=ready_message_unreadable handle=%d error=%r", handle, str(error))
            return None

    def _take_due(self, now_ms: int) -> tuple[list[DueMessage], int]:
        """Messages due within ``lead_ms``, once the first of them is due within
        ``min_lead_ms``, and the time they are taken up to: a step costs about the same
        whether it carries one message or fifty (a handout, its Raft round on every replica,
        the hand-over to the event loop), so the messages that came within ``lead_ms`` since
        the last step go together. A step that finds few (under ``slow_step_msgs``) takes
        what comes due within ``slow_lead_ms`` too: at a slow rate a step every 20 ms."""
        dispatch = self._config.dispatch
        until_ms = now_ms + dispatch.lead_ms
        now_s = self._clock.monotonic_s()
        if now_s < self._next_dispatch_s:
            return [], until_ms
        wheel = self._state.wheel
        due_ms = wheel.next_due_ms()
        if due_ms is None or due_ms > now_ms + dispatch.min_lead_ms:
            return [], until_ms
        deliveries = self.dispatcher.take(wheel, until_ms)
        if 0 < len(deliveries) < dispatch.slow_step_msgs and wheel.damage_held is None:
            until_ms = now_ms + dispatch.slow_lead_ms
            deliveries += self.dispatcher.take(wheel, until_ms,
                                               dispatch.slow_step_msgs - len(deliveries))
        if wheel.damage_held is not None:
            self._next_dispatch_s = now_s + DAMAGE_RETRY_S  # nothing passes it meanwhile
        return deliveries, until_ms

    def _sync_cursor(self, now_ms: int) -> None:
        now_s = self._clock.monotonic_s()
        if now_s - self._last_cursor_sync < self._config.cursor_sync_ms / 1000:
            return
        cursor, stamp_only = self.dispatcher.next_cursor(self._state.wheel,
                                                         self._state.readied, now_ms)
        floor = max(self._state.cursor, self._proposed_cursor or self._state.cursor)
        if cursor > floor or (stamp_only and self._proposed_cursor is None):
            self._last_cursor_sync = now_s
            self._proposed_cursor = cursor
            self._proposals.propose(commands.cursor(now_ms, cursor), self._cursor_applied())

    def _cursor_applied(self) -> Applied:
        future: Applied = Future()

        def clear(_: Applied) -> None:
            if self._proposed_cursor is not None and self._proposed_cursor <= self._state.cursor:
                self._proposed_cursor = None
        future.add_done_callback(clear)
        return future

    def _sleep_s(self, now_ms: int, delivered: int) -> float:
        dispatch = self._config.dispatch
        if (self.planner is not None and self.planner.waiting
                and self._requests.consumer_ops_queued):
            return 0.0  # credits queued unwoken while this step found messages waiting
        if self.dispatcher.unapplied >= dispatch.max_unapplied_msgs:
            # taking waits for a handout's apply, which a tick brings (an answer wakes it):
            # a wait of nothing spun the Raft thread through empty turns meanwhile
            return BLOCKED_WAIT_S
        if delivered >= dispatch.max_take_msgs:
            return 0.0  # a backlog: take the next step at once
        wait_ms = self._config.cursor_sync_ms
        due_ms = self._state.wheel.next_due_ms()
        if due_ms is not None and due_ms - dispatch.min_lead_ms - now_ms < wait_ms:
            wait_ms = max(0, due_ms - dispatch.min_lead_ms - now_ms)
            self.steps_next = True
        deadline_ms = None if self.planner is None else self.planner.next_deadline_ms()
        if deadline_ms is not None and deadline_ms - now_ms < wait_ms:
            wait_ms = max(0, deadline_ms - now_ms)
            self.steps_next = False
        held_s = self._next_dispatch_s - self._clock.monotonic_s()
        if held_s > wait_ms / 1000:
            self.steps_next = False
        return max(wait_ms / 1000, held_s)
