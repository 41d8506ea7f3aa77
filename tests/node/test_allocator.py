"""Giving freed memory back (`tickwheel.node.ops.allocator`): when the heaps are trimmed."""

from __future__ import annotations

from tickwheel.node.ops.allocator import TRIM_AFTER_BYTES, Allocator, TrimDue


def test_glibc_is_found_and_trims() -> None:
    assert Allocator().available  # Debian's images, and the machines the tests run on
    Allocator().trim()


def test_a_trim_is_due_once_a_look_after_streams_released_enough() -> None:
    due = TrimDue(released_bytes=1_000)
    assert due.look(1_000) == 0  # nothing released
    assert due.look(1_000 + TRIM_AFTER_BYTES - 1) == 0  # seen: not enough
    assert due.look(1_000 + TRIM_AFTER_BYTES) == 0  # seen: enough, one look to be freed
    assert due.look(1_000 + TRIM_AFTER_BYTES) == TRIM_AFTER_BYTES  # trimmed
    assert due.look(1_000 + TRIM_AFTER_BYTES) == 0  # once
    # released over several looks: counted from the last trim
    assert due.look(1_000 + TRIM_AFTER_BYTES + TRIM_AFTER_BYTES // 2) == 0
    assert due.look(1_000 + 2 * TRIM_AFTER_BYTES) == 0
    assert due.look(1_000 + 2 * TRIM_AFTER_BYTES) == TRIM_AFTER_BYTES
