"""Consumer groups and their leases: replicated, so a hand-out is a decision of the log.

When a message comes due the leader *readies* it (a `handout` command): it leaves the wheel and
joins the *ready* set of every consumer group of its topic (or only the group a retry copy was
made for). A consumer of a group gets it through a *lease*, granted by a command too, so every
replica knows which messages any leader ever handed out, to which group, how many times:

- a group's ``ready`` set holds messages waiting for a lease, oldest first, each with the
  sequence number and nonce of its last lease (0 if it never had one);
- its ``leases`` hold messages handed out: sequence number (1 for the first lease of the message
  in this group, +1 per lease after it), nonce (the random half of the receipt), deadline, and
  whether the lease ends with its stream (`STREAM`) or only at its deadline (`DURABLE`);
- an ack or a retry *resolves* the message in the group: it leaves both. A release (its stream
  closed, or a new leader took over from the one holding the stream) puts it back at the front
  of ``ready``, keeping its sequence number.

Hence the exact ``possible_duplicate``: a lease with sequence number above 1 follows an earlier
lease of the same message in the same group, which a consumer may have received.

A topic's *default group* (the consumers that name no group) is implicit while the topic has
no other group: it appears when a message of the topic is readied and goes away once it holds
nothing, so topics that come and go (or a client subscribing to made-up ones) leave nothing
behind. Once a topic has a named group its default group, if it exists, stays until deleted.

Memory: a group keeps at most ``max_ready_msgs`` ready messages (the oldest unleased ones are
dropped past it, logged and counted) and a plain dict entry per lease. Bodies stay in the wheel.
At most ``max_groups`` named groups exist; default groups are bounded by the topics with
messages ready or leased plus the topics with named groups.

Single-threaded (the Raft thread); other threads read `summary`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any, Final

from tickwheel.common.errors import invariant
from tickwheel.replication.commands import LeaseRef
from tickwheel.replication.group import (
    DEFAULT_GROUP,
    FanOut,
    Group,
    GroupSummary,
    Lease,
    PlainGroup,
)
from tickwheel.wheel.chains import GLOBAL_INDEX_BITS

log = logging.getLogger("tickwheel.replication.groups")

_NEVER_LEASED: Final = (0, 0)
"""A ready message's last lease: none yet."""

Snapshot = tuple[int, list[PlainGroup], dict[int, list[Any]]]
"""``(next_id, [group as plain values], fan-out)``: for the snapshot file."""


class Groups:
    """Every consumer group, by ``(topic, name)`` and by id."""

    def __init__(self, max_ready_msgs: int, max_groups: int) -> None:
        invariant(max_ready_msgs > 0 and max_groups > 0, "group limits must be positive")
        self._max_ready_msgs = max_ready_msgs
        self._max_groups = max_groups
        self._by_key: dict[tuple[str, str], Group] = {}
        self._by_id: dict[int, Group] = {}
        self._by_topic: dict[str, list[Group]] = {}
        self._fanout = FanOut()
        self._next_id = 1
        self._named = 0

    # -- reading ---------------------------------------------------------------------------

    def get(self, topic: str, name: str) -> Group | None:
        return self._by_key.get((topic, name))

    def by_id(self, group_id: int) -> Group | None:
        return self._by_id.get(group_id)

    def of_topic(self, topic: str) -> list[Group]:
        return self._by_topic.get(topic, [])

    def __iter__(self) -> Iterator[Group]:
        return iter(list(self._by_id.values()))

    def __len__(self) -> int:
        return len(self._by_id)

    def summary(self) -> list[GroupSummary]:
        """Counts per group, sorted (any thread: a list copy of the groups first)."""
        return sorted(GroupSummary(g.topic, g.name, len(g.ready), len(g.leases), g.dropped)
                      for g in list(self._by_id.values()))

    def oldest_hour(self) -> int | None:
        """The first hour any group still needs a message of."""
        hours = [min(g.ready) >> GLOBAL_INDEX_BITS for g in self._by_id.values() if g.ready]
        hours += [min(g.leases) >> GLOBAL_INDEX_BITS for g in self._by_id.values() if g.leases]
        return min(hours, default=None)

    # -- changing (applying commands) ------------------------------------------------------

    def create(self, topic: str, name: str, stamp_ms: int) -> bool:
        """Make sure the group ``(topic, name)`` exists; False when ``max_groups`` named
        groups exist. A topic's default group is implicit while the topic has no other group:
        asking for it then creates nothing."""
        if (topic, name) in self._by_key:
            return True
        if name == DEFAULT_GROUP:
            if topic in self._by_topic:
                self._create(topic, name, stamp_ms)
            return True
        if self._named >= self._max_groups:
            return False
        self._create(topic, name, stamp_ms)
        return True

    def delete(self, topic: str, name: str) -> bool:
        group = self._by_key.get((topic, name))
        if group is None:
            return False
        self._remove(group)
        for handle in list(group.ready) + list(group.leases):
            self._fanout.resolved(handle)
        log.info("event=group_deleted topic=%s group=%r ready=%d leased=%d", topic, name,
                 len(group.ready), len(group.leases))
        self._retire_if_idle(topic)
        return True

    def ready(self, handle: int, topic: str, target: str | None, stamp_ms: int) -> int:
        """Ready a due message for its groups (only ``target`` for a retry copy made for one
        group); a topic with no group, or a retry copy for the default group, gets the
        default group. Returns how many groups (0: its target group was deleted)."""
        if target is not None:
            group = self._by_key.get((topic, target))
            if group is None and target == DEFAULT_GROUP:
                group = self._create(topic, DEFAULT_GROUP, stamp_ms)
            groups = [group] if group is not None else []
        else:
            groups = self._by_topic.get(topic) or [self._create(topic, DEFAULT_GROUP, stamp_ms)]
        if not groups:
            log.warning("event=ready_without_group topic=%s target=%r handle=%d reason=%r",
                        topic, target, handle, "its group was deleted")
            return 0
        for group in groups:
            group.ready[handle] = (0, 0)
            if len(group.ready) > self._max_ready_msgs:
                self._drop_oldest(group)
        self._fanout.readied(handle, len(groups))
        return len(groups)

    def ready_many(self, items: Sequence[tuple[int, str, str | None]], stamp_ms: int) -> None:
        """`ready` each ``(handle, topic, target)``, in order, with the same outcome. A run of
        a topic's messages for all its groups costs one lookup and one C-level insert per
        group (every replica applies every hand-out, a quarter of a follower's apply). Retry
        copies for one group, a topic without groups yet, and a run that would push a group
        past ``max_ready_msgs`` go item by item, as they always did."""
        start = 0
        while start < len(items):
            _, topic, target = items[start]
            end = start + 1
            while end < len(items) and items[end][1] == topic and items[end][2] == target:
                end += 1
            groups = self._by_topic.get(topic) if target is None else None
            if not groups or any(len(group.ready) + end - start > self._max_ready_msgs
                                 for group in groups):
                for handle, _, _ in items[start:end]:
                    self.ready(handle, topic, target, stamp_ms)
            else:
                handles = [item[0] for item in items[start:end]]
                for group in groups:
                    group.ready.update(dict.fromkeys(handles, _NEVER_LEASED))
                if len(groups) > 1:
                    for handle in handles:
                        self._fanout.readied(handle, len(groups))
            start = end

    def grant_many(self, grants: Sequence[tuple[int, int, int, int, int, int]],
                   strings: Sequence[str]) -> list[int]:
        """Lease ready messages: per `read_handout` grant row (topic and group index
        ``strings``) its sequence number, or 0 if it is not ready in that group (cancelled,
        dropped, leased already; or the group is gone). One group lookup a run."""
        results: list[int] = []
        add = results.append
        fanout = self._fanout
        key, group = None, None
        tuple_new = tuple.__new__  # a NamedTuple's own constructor is a Python call
        for handle, topic, name, nonce, deadline_ms, mode in grants:
            if (topic, name) != key:
                key = (topic, name)
                group = self._by_key.get((strings[topic], strings[name]))
            if group is None or (last := group.ready.pop(handle, None)) is None:
                add(0)
                continue
            seq = last[0] + 1
            group.leases[handle] = tuple_new(Lease, (seq, nonce, deadline_ms, mode))
            if fanout:
                fanout.leased(handle)
            add(seq)
        return results

    def resolve_many(self, refs: Sequence[LeaseRef]) -> list[bool]:
        """`resolve` each, in order, with the same outcome: the usual ack, of a current
        lease, costs two dict operations; anything else takes `resolve`."""
        results: list[bool] = []
        add = results.append
        fanout = self._fanout
        group_id, group, topics = None, None, set()
        for ref in refs:
            ref_group, handle, seq, nonce = ref
            if ref_group != group_id:
                group_id, group = ref_group, self._by_id.get(ref_group)
            if (group is None or (lease := group.leases.get(handle)) is None
                    or lease[0] != seq or lease[1] != nonce):
                add(self.resolve(ref))
                continue
            del group.leases[handle]
            if fanout:
                fanout.resolved(handle)
            topics.add(group.topic)
            add(True)
        for topic in topics:  # as `resolve` does after each (a retired group acks nothing)
            self._retire_if_idle(topic)
        return results

    def find(self, ref: LeaseRef) -> tuple[Group, bool] | None:
        """The group of a genuine receipt and whether its lease is the current one (else the
        message is ready again after a release, under that same lease); None if the receipt
        names no lease this group holds."""
        current = self._current(ref)
        if current is not None:
            return current[0], True
        group = self._by_id.get(ref.group_id)
        if group is None or ref.handle in group.leases:
            return None
        if group.ready.get(ref.handle, (0, 0)) == (ref.seq, ref.nonce) and ref.seq:
            return group, False
        return None

    def resolve(self, ref: LeaseRef) -> bool:
        """An ack (or a retry) of a genuine receipt: the message leaves its group."""
        found = self.find(ref)
        if found is None:
            return False
        group, leased = found
        if leased:
            del group.leases[ref.handle]
        else:
            del group.ready[ref.handle]
        self._fanout.resolved(ref.handle)
        self._retire_if_idle(group.topic)
        return True

    def release(self, ref: LeaseRef) -> bool:
        """The lease ends early: the message is ready again, first in line."""
        current = self._current(ref)
        if current is None:
            return False
        current[0].back_to_ready(ref.handle, current[1])
        return True

    def give_back(self, ref: LeaseRef) -> bool:
        """The lease ends before its message was ever sent: ready again, first in line, as
        if the lease had not been granted, so the next one is not flagged for it (its number
        is taken again, under a new nonce). A receipt of the lease before it stops counting,
        as if that one had been given back too (only an ack of a released lease's receipt
        would have used it)."""
        current = self._current(ref)
        if current is None:
            return False
        group, lease = current
        group.back_to_ready(ref.handle, lease._replace(seq=lease.seq - 1, nonce=0))
        return True

    def extend(self, ref: LeaseRef, deadline_ms: int) -> bool:
        """Move a current lease's deadline."""
        current = self._current(ref)
        if current is None:
            return False
        group, lease = current
        group.leases[ref.handle] = lease._replace(deadline_ms=deadline_ms)
        return True

    def release_streams(self) -> int:
        """A new leader took office: every stream lease ends (its stream died with the old
        leader's office), so its message is ready again. Returns how many."""
        return sum(group.release_streams() for group in self._by_id.values())

    def never_leased(self, handle: int, topic: str) -> bool | None:
        """Of a readied message: None if no group holds it any more (all resolved it); True
        if no group ever leased it; False if some group did."""
        holding = self._holding(handle, topic)
        return None if not holding else not self._handed_out(handle, holding)

    def cancel(self, handle: int, topic: str) -> bool | None:
        """Cancel a readied message: `never_leased`, and the message leaves every group that
        never leased it (all of them when True: it will never be handed out)."""
        holding = self._holding(handle, topic)
        if not holding:
            return None
        handed_out = self._handed_out(handle, holding)
        for group in holding:
            if group.ready.get(handle, (1, 0))[0] == 0:
                del group.ready[handle]
                self._fanout.resolved(handle)
        self._retire_if_idle(topic)
        return not handed_out

    def _holding(self, handle: int, topic: str) -> list[Group]:
        return [g for g in self._by_topic.get(topic, ()) if handle in g.ready
                or handle in g.leases]

    def _handed_out(self, handle: int, holding: list[Group]) -> bool:
        return self._fanout.ever_leased(handle) or any(
            handle in g.leases or g.ready[handle][0] for g in holding)

    # -- snapshots --------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        return (self._next_id, [group.plain() for group in self._by_id.values()],
                self._fanout.snapshot())

    def restore(self, snapshot: Snapshot) -> None:
        next_id, groups, fanout = snapshot
        self._by_key, self._by_id, self._by_topic = {}, {}, {}
        self._named = 0
        self._fanout = FanOut({handle: list(entry) for handle, entry in fanout.items()})
        self._next_id = next_id
        for plain in groups:
            self._add(Group.from_plain(plain))

    # -- internals ----------------------------------------------------------------------------

    def _current(self, ref: LeaseRef) -> tuple[Group, Lease] | None:
        """The group and lease ``ref`` names, if that lease is the message's current one."""
        group = self._by_id.get(ref.group_id)
        lease = group.current(ref.handle, ref.seq, ref.nonce) if group is not None else None
        return None if group is None or lease is None else (group, lease)

    def _create(self, topic: str, name: str, stamp_ms: int) -> Group:
        group = Group(self._next_id, topic, name, stamp_ms)
        self._next_id += 1
        self._add(group)
        if name != DEFAULT_GROUP:
            log.info("event=group_created topic=%s group=%r id=%d", topic, name, group.id)
        return group

    def _add(self, group: Group) -> None:
        self._by_key[group.topic, group.name] = group
        self._by_id[group.id] = group
        self._by_topic.setdefault(group.topic, []).append(group)
        self._named += group.name != DEFAULT_GROUP

    def _remove(self, group: Group) -> None:
        del self._by_key[group.topic, group.name]
        del self._by_id[group.id]
        siblings = self._by_topic[group.topic]
        siblings.remove(group)
        if not siblings:
            del self._by_topic[group.topic]
        self._named -= group.name != DEFAULT_GROUP

    def _retire_if_idle(self, topic: str) -> None:
        """A default group that is its topic's only group and holds nothing goes away (it
        is implicit: the topic's next due message brings it back)."""
        groups = self._by_topic.get(topic)
        if groups is not None and len(groups) == 1:
            group = groups[0]
            if group.name == DEFAULT_GROUP and not group.ready and not group.leases:
                self._remove(group)

    def _drop_oldest(self, group: Group) -> None:
        handle, _ = group.ready.popitem(last=False)
        group.dropped += 1
        self._fanout.resolved(handle)
        if group.dropped == 1 or group.dropped % 1000 == 0:
            log.warning("event=ready_dropped topic=%s group=%r dropped=%d max_ready_msgs=%d "
                        "handle=%d", group.topic, group.name, group.dropped,
                        self._max_ready_msgs, handle)


