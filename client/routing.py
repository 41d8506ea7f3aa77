"""Which node a client calls: the leader once an answer named it, else the targets in turn,
passing over a node that just failed."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence

LEADER_KEY = "tickwheel-leader"
"""The trailing metadata key of a node's answer that names the leader's gRPC address."""

FAILED_COOLDOWN_S = 1.0
"""How long a node whose call failed is passed over, unless every node failed: a paused
leader's followers name it as leader until their election ends, and a new connection to a
stopped process hangs in its handshake instead of failing."""


class Router:
    """Which node to call: the leader, once a response has named it; else the given targets in
    turn. A failed call moves on to the next target, and the node that failed is passed over
    (and not taken as leader from a hint) for `FAILED_COOLDOWN_S`."""

    def __init__(self, targets: str | Sequence[str],
                 clock_s: Callable[[], float] = time.monotonic) -> None:
        listed = [targets] if isinstance(targets, str) else list(targets)
        self.targets = [t.strip() for item in listed for t in item.split(",") if t.strip()]
        if not self.targets:
            raise ValueError("no target address given")
        self._next = random.randrange(len(self.targets))
        self._clock_s = clock_s
        self._failed_s: dict[str, float] = {}
        self.leader: str | None = None

    def choose(self) -> str:
        if self.leader:
            return self.leader
        for _ in self.targets:
            target = self.targets[self._next % len(self.targets)]
            if not self._cooling(target):
                return target
            self._next += 1
        return self.targets[self._next % len(self.targets)]

    def observe(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> None:
        """Remember the leader a response named."""
        for key, value in metadata or ():
            if (key == LEADER_KEY and value and isinstance(value, str)
                    and not self._cooling(value)):
                self.leader = value

    def failed(self, address: str) -> None:
        self._failed_s[address] = self._clock_s()
        if self.leader == address:
            self.leader = None
        else:
            self._next += 1

    def _cooling(self, address: str) -> bool:
        failed_s = self._failed_s.get(address)
        return failed_s is not None and self._clock_s() - failed_s < FAILED_COOLDOWN_S
