"""Giving freed memory back to the system: glibc keeps what a consumer's stream made the node
hold after it is freed, unless asked (``malloc_trim``).

glibc serves an allocation of 128 KiB or more (a message body read for delivery, a Raft entry,
an encoded response) with a mapping of its own, unmapped when it is freed, but that *mmap
threshold* moves: each such chunk freed raises it to the chunk's size (up to 32 MiB), and the
next ones come from the heaps, whose free memory glibc keeps, as it keeps that of smaller
allocations. A stream that never read pinned 200 MiB of bodies; freed once it was closed, the
leader kept 140-190 MB of them (1 MiB and 64 KiB bodies), for as long as it ran. So after
consumers' streams left holding at least `TRIM_AFTER_BYTES` of bodies, `give_back_released`
trims the heaps: the leader then came back to below where it started.

Holding the mmap threshold at start (``mallopt``) instead gave large bodies back without a
trim, but not small ones, and costs every large allocation a mapping and its pages' first
touch (~20 us for 256 KiB), on the path every byte of a large body takes several times.

glibc only: with another C library (musl, in an Alpine image) nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import time
from collections.abc import Callable

log = logging.getLogger("tickwheel.node")

TRIM_AFTER_BYTES = 32 << 20
"""Bodies released by streams that left, since the last trim, that make the next one worth its
cost: a trim walks every heap (15-45 ms after 200 MiB of bodies were freed), in a thread of its
own, while the other threads' allocations in the heap it walks wait."""
TRIM_CHECK_S = 1.0
"""How often the released bytes are looked at. A trim comes one look after the release was
seen, so that the leases' release has been applied and their bodies freed by then; what is
still held (a response gRPC is still writing) is given back by a later trim, or reused."""


class Allocator:
    """glibc's ``malloc_trim``; `available` is False with another C library."""

    def __init__(self) -> None:
        try:
            libc: ctypes.CDLL | None = ctypes.CDLL(None)
        except OSError:
            libc = None
        glibc = libc is not None and hasattr(libc, "gnu_get_libc_version")
        self._libc = libc if glibc else None

    @property
    def available(self) -> bool:
        return self._libc is not None

    def trim(self) -> bool:
        """Give the heaps' free pages back to the system; whether any were."""
        return self._libc is not None and bool(self._libc.malloc_trim(ctypes.c_size_t(0)))


class TrimDue:
    """Whether a trim is due, looking at the bytes released every `TRIM_CHECK_S`: once at
    least `TRIM_AFTER_BYTES` were released since the last trim, at the look after the one
    that saw them."""

    def __init__(self, released_bytes: int) -> None:
        self._trimmed = self._seen = released_bytes

    def look(self, released_bytes: int) -> int:
        """The bytes released for the trim due now (0: none is)."""
        due = self._seen - self._trimmed
        if due >= TRIM_AFTER_BYTES:
            self._trimmed = self._seen
        else:
            due = 0
        self._seen = released_bytes
        return due


async def give_back_released(allocator: Allocator, released_bytes: Callable[[], int]) -> None:
    """Trim the heaps once consumers' streams left holding at least `TRIM_AFTER_BYTES` of
    bodies since the last trim (``released_bytes`` counts them), for ever (cancel to stop)."""
    if not allocator.available:
        return
    due = TrimDue(released_bytes())
    while True:
        await asyncio.sleep(TRIM_CHECK_S)
        released = due.look(released_bytes())
        if released:
            start_s = time.monotonic()
            gave_back = await asyncio.to_thread(allocator.trim)
            log.info("event=memory_trimmed released_bytes=%d gave_back=%s duration_ms=%.1f",
                     released, gave_back, (time.monotonic() - start_s) * 1000)
