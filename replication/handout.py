"""The leader's side of hand-out: which consumer gets which ready message, as lease grants.

The replica's Raft thread owns a `Planner` per leadership. Consumers (the node's streams) join
with their group and credits; each dispatch step the planner turns messages that came due
(`Dispatcher.take`) and messages waiting in the groups' ready sets into one `handout` command:
the new messages readied, leases granted to consumers with credits. Only once that command is
applied does the sink get the messages (`Delivery`), so a message is never sent on a lease the
log does not hold.

Fair: groups with demand take turns, a batch each, and so do the consumers of a group; a group
stops getting leases at its in-flight budget (``max_inflight_msgs``, ``max_inflight_bytes``),
without holding back any other group, and a group with no consumer holds back nothing: its
messages wait in its ready set (`tickwheel.replication.groups`).

Leader-local and single-threaded (the Raft thread). Nothing here survives a change of leader;
what must is in the log.
"""

from __future__ import annotations

import base64
import binascii
import os
import struct
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from tickwheel.common.errors import InvalidMessage
from tickwheel.common.runheap import RunHeap
from tickwheel.replication.commands import Grant, LeaseRef, Ready
from tickwheel.replication.dispatcher import Delivery, DispatchConfig, Expired
from tickwheel.replication.group import DEFAULT_GROUP, DURABLE, STREAM, Group, Lease
from tickwheel.replication.groups import Groups
from tickwheel.wheel import DueMessage

TARGET_GROUP_PROPERTY: Final = "%group"
"""The property of a retry copy that names the one group it is for (users cannot set keys
that start with ``%``); the node strips it before a consumer sees the message."""
_NONCE_BATCH: Final = struct.Struct("<512Q")
_RECEIPT: Final = struct.Struct("<IqIQ")
_RECEIPT_CHARS: Final = _RECEIPT.size // 3 * 4
_MAX_BATCH: Final = 256
_MAX_KEPT_MSGS: Final = 50_000
_MAX_KEPT_BYTES: Final = 64 << 20
"""Bounds of the bodies a leader keeps of messages readied and not granted yet."""
MIN_DEADLINES_KEPT: Final = 4_096
"""Lease deadlines a leader keeps, stale ones included, before it drops the stale ones
(`Planner._drop_stale_deadlines`)."""
STALLED_MS: Final = 10_000
"""A group none of whose consumers was granted a message for this long no longer holds its
topic's readying back (`Planner.reading`)."""


def encode_receipt(lease: LeaseRef, shard: int = 0) -> str:
    """A receipt: the lease, with its random nonce (unguessable: 64 bits); on a shard other
    than 0, after the prefix ``<shard>.`` (clients send acks to the shard a receipt names)."""
    return encode_receipts([lease], shard)[0]


def encode_receipts(leases: Sequence[LeaseRef], shard: int = 0) -> list[str]:
    """`encode_receipt` of each lease, with one base64 call for the batch: a packed lease is
    24 bytes, a multiple of 3, so its receipt is the same 32 characters alone or in a row."""
    encoded = base64.urlsafe_b64encode(b"".join(_RECEIPT.pack(*lease) for lease in leases))
    text = encoded.decode()
    receipts = [text[start:start + _RECEIPT_CHARS]
                for start in range(0, len(text), _RECEIPT_CHARS)]
    return [f"{shard}.{receipt}" for receipt in receipts] if shard else receipts


def decode_receipt(receipt: str, field_name: str, shard: int = 0) -> LeaseRef:
    """The lease a receipt of ``shard`` names; `InvalidMessage` naming ``field_name`` if it
    is no receipt at all, or another shard's."""
    prefix, dot, rest = receipt.partition(".")
    if dot:
        if prefix != str(shard) or not shard:
            raise InvalidMessage(field_name, f"is a receipt of shard {prefix[:8]!r}, not of "
                                 f"this shard ({shard}): ack it there")
        receipt = rest
    elif shard:
        raise InvalidMessage(field_name, f"is a receipt of shard 0, not of this shard "
                             f"({shard}): ack it there")
    try:
        raw = base64.urlsafe_b64decode(receipt.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raw = b""
    if len(raw) != _RECEIPT.size:
        raise InvalidMessage(field_name, "is not a receipt this cluster gave out")
    return LeaseRef(*_RECEIPT.unpack(raw))


@dataclass(eq=False, slots=True)
class ConsumerSlot:
    key: int
    topic: str
    group: str
    credits: int
    visibility_ms: int
    mode: int


@dataclass(eq=False, slots=True)
class _Demand:
    consumers: deque[ConsumerSlot] = field(default_factory=deque)
    granted_ms: int = 0
    """When a consumer of the group was last granted a message."""
    granting: set[int] = field(default_factory=set)
    """Handles in handouts proposed and not yet applied."""
    bytes_out: int = 0


class Plan(NamedTuple):
    ready: list[Ready]
    grants: list[Grant]
    sends: list[tuple[DueMessage, ConsumerSlot]]
    """Per grant, in order: the message and its consumer."""


def _held(groups: Groups, deadline: tuple[int, int, int, int, int]) -> tuple[Group, Lease] | None:
    """The group and lease a queued deadline ``(expire at ms, deadline_ms, group id, handle,
    seq)`` is of, if that lease is still held as it was watched (None: the entry is stale)."""
    _, deadline_ms, group_id, handle, seq = deadline
    group = groups.by_id(group_id)
    lease = group.leases.get(handle) if group is not None else None
    if group is None or lease is None or lease.seq != seq or lease.deadline_ms != deadline_ms:
        return None
    return group, lease


class Planner:
    """Consumers, credits and budgets of one leadership."""

    def __init__(self, config: DispatchConfig, epoch: int) -> None:
        self._config = config
        self.epoch = epoch
        self._consumers: dict[int, ConsumerSlot] = {}
        self._demand: dict[tuple[str, str], _Demand] = {}
        self._holders: dict[tuple[int, int], tuple[int, DueMessage, LeaseRef]] = {}
        """(group id, handle) -> (consumer key, message, lease), for leases this leader
        granted. The message is the sink's (`Delivery.message`), not a copy, and stays while
        its lease does (within its group's budget): when the lease runs out it is retried
        from here, where reading it from the wheel again made a second copy of every body a
        consumer held (a stalled stream's whole budget at once)."""
        self._deadlines = RunHeap[tuple[int, int, int, int, int]]()
        """(expire at ms, deadline_ms, group id, handle, seq) of leases; stale entries (the
        lease resolved, or its deadline moved) are skipped. Grants come in due order, so
        their deadlines mostly do too: a `RunHeap`, where a heap of 600,000 (20,000 msg/s
        with a 30 s visibility timeout) cost ~20 comparisons a pop. Stale entries are dropped
        once they are most of it (`_drop_stale_deadlines`): a lease acked in a second left its
        entry for the whole visibility timeout, 390,000 of them (66 MB) at 13,000 msg/s."""
        self._deadlines_kept = MIN_DEADLINES_KEPT
        """The size of ``_deadlines`` past which its stale entries are dropped."""
        self._sent: dict[tuple[int, int], int] = {}
        """(group id, handle) -> when its message was sent plus its consumer's visibility
        timeout: a lease expires at that time, if it is later than its replicated deadline."""
        self._expiring: set[tuple[int, int]] = set()
        self._nonces: list[int] = []
        self._bodies: OrderedDict[int, DueMessage] = OrderedDict()
        self._bodies_bytes = 0
        self.waiting = False
        """Whether the latest plan left messages ungranted in a group with consumers (read
        from any thread: a credit then wakes the Raft thread; otherwise it waits for the
        next step)."""

    # -- consumers ------------------------------------------------------------------------

    def join(self, slot: ConsumerSlot) -> None:
        self._consumers[slot.key] = slot
        self._demand.setdefault((slot.topic, slot.group), _Demand()).consumers.append(slot)

    def credit(self, key: int, credits: int) -> None:
        slot = self._consumers.get(key)
        if slot is not None:
            slot.credits = max(0, slot.credits + credits)  # a negative grant takes back

    def leave(self, key: int) -> tuple[list[LeaseRef], list[LeaseRef]]:
        """A consumer's stream closed: the stream leases it holds, to release, as those whose
        messages the courier sent (`sent`) and those it never did."""
        slot = self._consumers.pop(key, None)
        if slot is None:
            return [], []
        demand = self._demand[slot.topic, slot.group]
        demand.consumers.remove(slot)
        if not demand.consumers and not demand.granting:
            del self._demand[slot.topic, slot.group]
        sent: list[LeaseRef] = []
        unsent: list[LeaseRef] = []
        if slot.mode == STREAM:
            for holder, _, lease in self._holders.values():
                if holder == key:
                    was_sent = (lease.group_id, lease.handle) in self._sent
                    (sent if was_sent else unsent).append(lease)
        return sent, unsent

    def has(self, key: int) -> bool:
        return key in self._consumers

    def reading(self, now_ms: int) -> list[tuple[str, str]]:
        """The groups whose consumers are taking messages: they have consumers, and one was
        granted a message within `STALLED_MS`. A group whose consumers took nothing for that
        long (stuck, or gone quiet) holds nothing back."""
        since_ms = now_ms - STALLED_MS
        return [key for key, demand in self._demand.items()
                if demand.consumers and demand.granted_ms >= since_ms]

    # -- planning ---------------------------------------------------------------------------

    def plan(self, groups: Groups, taken: list[DueMessage], now_ms: int, due_until_ms: int,
             read: Callable[[int], DueMessage | None]) -> Plan:
        """The handout of one step: ``taken`` readied for their groups, and grants to
        consumers with credits, groups taking turns, of messages due by ``due_until_ms``
        (a little ahead of ``now_ms``: the sink sends each at its due time). ``read`` fetches
        a ready message's body from the wheel (None if it is gone)."""
        new = tuple.__new__  # a namedtuple's own constructor is a Python call per message
        ready = [new(Ready, (m.handle, m.slot_second, m.local_index, m.topic,
                             m.properties.get(TARGET_GROUP_PROPERTY))) for m in taken]
        fresh: dict[tuple[str, str], deque[DueMessage]] = {}
        for message, item in zip(taken, ready, strict=True):
            if item.target is not None:
                names = [item.target]
            else:
                names = [g.name for g in groups.of_topic(message.topic)] or [DEFAULT_GROUP]
            for name in names:
                if (message.topic, name) in self._demand:
                    fresh.setdefault((message.topic, name), deque()).append(message)
        grants: list[Grant] = []
        sends: list[tuple[DueMessage, ConsumerSlot]] = []
        turns = deque(key for key, demand in self._demand.items()
                      if any(slot.credits for slot in demand.consumers))
        backlogs = {key: self._backlog(groups.get(*key), self._demand[key]) for key in turns}
        cached = self._read_cached(read)
        while turns:
            key = turns.popleft()
            if self._grant_batch(key, groups.get(*key), backlogs[key], fresh.get(key),
                                 now_ms, due_until_ms, cached, grants, sends):
                turns.append(key)
        for left in fresh.values():
            self._keep(left)
        self.waiting = any(fresh.values()) or self._ready_waiting(groups)
        return Plan(ready, grants, sends)

    def _ready_waiting(self, groups: Groups) -> bool:
        """Whether a group with consumers holds a ready message no handout in flight grants
        (each look stops at the first such message, after at most the ones in flight)."""
        for key, demand in self._demand.items():
            group = groups.get(*key)
            if group is not None and any(handle not in demand.granting
                                         for handle in group.ready):
                return True
        return False

    def _keep(self, messages: deque[DueMessage]) -> None:
        """Keep the bodies of messages readied and not granted yet, so granting them later
        does not read them from the wheel again (bounded: the oldest go first)."""
        bodies = self._bodies
        for message in messages:
            if message.handle not in bodies:
                bodies[message.handle] = message
                self._bodies_bytes += len(message.body)
        while bodies and (len(bodies) > _MAX_KEPT_MSGS or self._bodies_bytes > _MAX_KEPT_BYTES):
            self._bodies_bytes -= len(bodies.popitem(last=False)[1].body)

    def _read_cached(self, read: Callable[[int], DueMessage | None]
                     ) -> Callable[[int], DueMessage | None]:
        bodies = self._bodies

        def cached(handle: int) -> DueMessage | None:
            message = bodies.pop(handle, None)
            if message is None:
                return read(handle)
            self._bodies_bytes -= len(message.body)
            return message
        return cached

    def _backlog(self, group: Group | None, demand: _Demand) -> deque[int]:
        if group is None or not group.ready:
            return deque()
        granting = demand.granting
        wanted = sum(slot.credits for slot in demand.consumers)
        backlog: deque[int] = deque()
        for handle in group.ready:
            if handle not in granting:
                backlog.append(handle)
                if len(backlog) >= wanted:
                    break
        return backlog

    def _grant_batch(self, key: tuple[str, str], group: Group | None, backlog: deque[int],
                     fresh: deque[DueMessage] | None, now_ms: int, due_until_ms: int,
                     read: Callable[[int], DueMessage | None], grants: list[Grant],
                     sends: list[tuple[DueMessage, ConsumerSlot]]) -> bool:
        """Grant one batch of ``key``'s messages to its next consumer with credits; whether
        the group can take another turn."""
        demand = self._demand[key]
        slot = next((s for s in demand.consumers if s.credits > 0), None)
        if slot is None:
            return False
        demand.consumers.remove(slot)
        demand.consumers.append(slot)  # the next batch goes to the next consumer
        leased = len(group.leases) if group is not None else 0
        room = min(slot.credits, _MAX_BATCH,
                   self._config.max_inflight_msgs - leased - len(demand.granting))
        count = 0
        while count < room and demand.bytes_out < self._config.max_inflight_bytes:
            message = None
            while message is None and backlog:
                message = read(backlog.popleft())
                if message is not None and message.deliver_at_ms > due_until_ms:
                    message = None  # readied by a leader whose clock runs ahead of this one
            if message is None and fresh:
                message = fresh.popleft()
            if message is None:
                break
            deadline_ms = max(now_ms, message.deliver_at_ms) + slot.visibility_ms
            grants.append(tuple.__new__(Grant, (message.handle, key[0], key[1], self._nonce(),
                                                deadline_ms, slot.mode)))
            sends.append((message, slot))
            demand.granting.add(message.handle)
            demand.bytes_out += len(message.body)
            count += 1
        slot.credits -= count
        if count:
            demand.granted_ms = now_ms
        return count > 0 and (bool(backlog) or bool(fresh))

    def _nonce(self) -> int:
        """A random 64-bit nonce (from the OS's CSPRNG, drawn 512 at a time: one call each
        cost a fifth of a step's planning)."""
        if not self._nonces:
            self._nonces = list(_NONCE_BATCH.unpack(os.urandom(_NONCE_BATCH.size)))
        return self._nonces.pop()

    def granted(self, plan: Plan, seqs: list[int], groups: Groups) -> list[Delivery]:
        """The handout was applied: the deliveries of the grants that took (a grant on a
        message cancelled meanwhile took nothing)."""
        deliveries = []
        new, epoch, holders, push = tuple.__new__, self.epoch, self._holders, self._deadlines.push
        key: tuple[str, str] | None = None
        demand: _Demand | None = None
        group: Group | None = None
        for grant, (message, slot), seq in zip(plan.grants, plan.sends, seqs, strict=True):
            if key is None or grant.topic != key[0] or grant.group != key[1]:
                key = grant.topic, grant.group  # a plan grants in batches of one group
                demand, group = self._demand.get(key), groups.get(*key)
            if demand is not None:
                demand.granting.discard(grant.handle)
            if not seq or group is None:
                slot.credits += 1
                if demand is not None:
                    demand.bytes_out -= len(message.body)
                continue
            lease = new(LeaseRef, (group.id, grant.handle, seq, grant.nonce))
            holders[group.id, grant.handle] = (slot.key, message, lease)
            push((grant.deadline_ms, grant.deadline_ms, group.id, grant.handle, seq))
            deliveries.append(new(Delivery, (message, slot.key, lease, seq > 1, epoch)))
        return deliveries

    def failed(self, plan: Plan) -> None:
        """The handout was not committed (leadership is ending): give the credits back."""
        for grant, (message, slot) in zip(plan.grants, plan.sends, strict=True):
            demand = self._demand.get((grant.topic, grant.group))
            if demand is not None:
                demand.granting.discard(grant.handle)
                demand.bytes_out -= len(message.body)
            slot.credits += 1

    def sent(self, key: int, leases: Sequence[LeaseRef], sent_ms: int) -> None:
        """The courier sent these leases' messages to consumer ``key`` at ``sent_ms``: their
        visibility timeout counts from then, since the grant was planned a commit round
        before the consumer could see the message."""
        slot = self._consumers.get(key)
        if slot is None:
            return  # the consumer left: its leases are released
        for lease in leases:
            if (lease.group_id, lease.handle) in self._holders:
                self._sent[lease.group_id, lease.handle] = sent_ms + slot.visibility_ms

    # -- leases ending ----------------------------------------------------------------------

    def resolved(self, group_id: int, handle: int, topic: str, group: str) -> None:
        """A lease this leader may have granted ended (ack, retry, release applied)."""
        held = self._holders.pop((group_id, handle), None)
        self._expiring.discard((group_id, handle))
        self._sent.pop((group_id, handle), None)
        if held is not None:
            demand = self._demand.get((topic, group))
            if demand is not None:
                demand.bytes_out -= len(held[1].body)

    def watch(self, deadline_ms: int, group_id: int, handle: int, seq: int) -> None:
        """Expire this lease at ``deadline_ms`` (a lease of an earlier leader, or extended)."""
        self._sent.pop((group_id, handle), None)
        self._deadlines.push((deadline_ms, deadline_ms, group_id, handle, seq))

    def expired(self, groups: Groups, now_ms: int,
                read: Callable[[int], DueMessage | None]) -> list[Expired]:
        """Leases whose deadline passed, each once (until it is resolved). ``read`` fetches
        the message of a lease this leader did not grant (an earlier leader's)."""
        found = []
        deadlines = self._deadlines
        if len(deadlines) > self._deadlines_kept:
            self._drop_stale_deadlines(groups)
        while (first := deadlines.first()) is not None and first[0] <= now_ms:
            entry = deadlines.pop()
            _, deadline_ms, group_id, handle, seq = entry
            held_lease = _held(groups, entry)
            if held_lease is None or (group_id, handle) in self._expiring:
                continue
            group, lease = held_lease
            sent_until_ms = self._sent.get((group_id, handle), 0)
            if sent_until_ms > now_ms:
                deadlines.push((sent_until_ms, deadline_ms, group_id, handle, seq))
                continue
            held = self._holders.get((group_id, handle))
            message = read(handle) if held is None else held[1]
            if message is None:
                continue
            self._expiring.add((group_id, handle))
            found.append(Expired(message, LeaseRef(group_id, handle, seq, lease.nonce),
                                 group.name, self.epoch, None if held is None else held[0],
                                 lease.mode == DURABLE))
        return found

    def _drop_stale_deadlines(self, groups: Groups) -> None:
        """Keep the deadlines of leases still held as they were watched, and let the queue
        grow to twice those before the next pass: a pass costs what the entries since the
        last one did, and the queue is bounded by the leases held, which the groups' budgets
        bound (`max_inflight_msgs`)."""
        self._deadlines.keep(lambda entry: _held(groups, entry) is not None)
        self._deadlines_kept = max(MIN_DEADLINES_KEPT, 2 * len(self._deadlines))

    def next_deadline_ms(self) -> int | None:
        first = self._deadlines.first()
        return None if first is None else first[0]
