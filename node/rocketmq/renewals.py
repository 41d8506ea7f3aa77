"""Leases a RocketMQ PushConsumer received with ``auto_renew``: kept alive while it is.

A PushConsumer names no invisible duration: the server picks one (`LEASE_MS`) and renews it
while the client lives, so a listener that runs long is not handed the same message twice.
Here a lease is renewed every `RENEW_S` while its client has called this node (a heartbeat
every 10 s, a receive, an ack) within `CLIENT_ALIVE_S`; it is forgotten when settled, when a
renewal finds it gone, when its client terminates or falls silent (then it runs out and the
message comes back). What this node holds is lost with it: those leases run out too.

At most `MAX_HELD` leases are held; past it, new ones are not renewed (logged).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from tickwheel.node.security.access import Principal

log = logging.getLogger("tickwheel.node.rocketmq")

LEASE_MS = 60_000
"""The invisible duration of a receive with ``auto_renew`` and none given (the Java proxy's)."""
RENEW_S = 20.0
CLIENT_ALIVE_S = 35.0
"""A client silent this long is gone (it heartbeats every 10 s)."""
MAX_HELD = 100_000

Renew = Callable[[Principal, str, str, list[str], int], Awaitable[list[bool]]]
"""``(principal, topic, group, receipts, invisible_ms)`` -> per receipt, whether its lease
was still current."""


@dataclass(slots=True)
class _Client:
    seen_s: float
    principal: Principal
    held: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    """receipt -> (topic, group, invisible_ms)"""


class Renewals:
    """On the event loop."""

    def __init__(self, renew: Renew, clock_s: Callable[[], float] = time.monotonic) -> None:
        self._renew = renew
        self._clock_s = clock_s
        self._clients: dict[str, _Client] = {}
        self._held = 0
        self._task: asyncio.Task[None] | None = None
        self._warned = False

    def seen(self, client_id: str) -> None:
        """A call of ``client_id``: it lives (only clients holding leases are tracked)."""
        client = self._clients.get(client_id)
        if client is not None:
            client.seen_s = self._clock_s()

    def hold(self, client_id: str, principal: Principal, topic: str, group: str,
             receipts: Iterable[str], invisible_ms: int) -> None:
        client = self._clients.get(client_id)
        if client is None:
            client = self._clients[client_id] = _Client(self._clock_s(), principal)
        client.seen_s, client.principal = self._clock_s(), principal
        for receipt in receipts:
            if self._held >= MAX_HELD:
                if not self._warned:
                    log.warning("event=auto_renew_full held=%d: further leases are not "
                                "renewed and run out after %d ms", self._held, invisible_ms)
                    self._warned = True
                return
            if receipt not in client.held:
                self._held += 1
            client.held[receipt] = (topic, group, invisible_ms)
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    def drop(self, client_id: str, receipts: Iterable[str]) -> None:
        client = self._clients.get(client_id)
        if client is not None:
            for receipt in receipts:
                if client.held.pop(receipt, None) is not None:
                    self._held -= 1

    def forget(self, client_id: str) -> None:
        client = self._clients.pop(client_id, None)
        if client is not None:
            self._held -= len(client.held)

    async def renew_once(self) -> None:
        """Renew the leases of live clients; forget silent ones."""
        now_s = self._clock_s()
        for client_id, client in list(self._clients.items()):
            if now_s - client.seen_s > CLIENT_ALIVE_S:
                log.info("event=auto_renew_client_gone client=%r leases=%d", client_id,
                         len(client.held))
                self.forget(client_id)
                continue
            batches: dict[tuple[str, str, int], list[str]] = {}
            for receipt, key in client.held.items():
                batches.setdefault(key, []).append(receipt)
            for (topic, group, invisible_ms), receipts in batches.items():
                try:
                    current = await self._renew(client.principal, topic, group, receipts,
                                                invisible_ms)
                except Exception as error:  # a leader change: the next round tries again
                    log.warning("event=auto_renew_failed topic=%s group=%r leases=%d "
                                "error=%r", topic, group, len(receipts), error)
                    continue
                self.drop(client_id, [r for r, ok in zip(receipts, current, strict=True)
                                      if not ok])

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(RENEW_S)
            await self.renew_once()
