"""Client handles: a keyed permutation of wheel handles, its key set once by the first barrier
and kept in snapshots."""

from __future__ import annotations

import os
import random
from pathlib import Path

from tickwheel.replication import commands
from tickwheel.replication.handle_cipher import HANDLE_BITS, HandleCipher
from tickwheel.replication.state import StateConfig, StateMachine
from tickwheel.wheel import Cursor

T0_MS = 1_800_000_000_000


def test_client_handles_round_trip_stay_positive_int64_and_depend_on_the_key() -> None:
    rng = random.Random(7)
    wheel_handles = [0, 1, (1 << HANDLE_BITS) - 1, 493_000 << 32 | 17] + [
        rng.randrange(1 << HANDLE_BITS) for _ in range(5_000)]
    cipher = HandleCipher(os.urandom(16))
    client = cipher.encode(wheel_handles)
    assert cipher.decode(client) == wheel_handles
    assert all(0 <= h < 1 << HANDLE_BITS for h in client)
    assert len(set(client)) == len(set(wheel_handles))
    # neighbours in the wheel are nowhere near each other outside it
    first, second = cipher.encode([493_000 << 32 | 17, 493_000 << 32 | 18])
    assert abs(first - second) > 1 << 20
    assert HandleCipher(os.urandom(16)).encode(wheel_handles[:100]) != client[:100]
    assert cipher.decode([-1, 1 << HANDLE_BITS, 2**63 - 1]) == [None, None, None]
    assert cipher.encode([]) == [] and cipher.decode([]) == []


def test_the_permutation_is_the_one_handles_were_issued_under() -> None:
    """Handles outlive restarts and upgrades: the permutation may get faster, never other.
    (Known answers from the first implementation, one AES call per block.)"""
    cipher = HandleCipher(bytes(range(16)))
    wheel_handles = [0, 1, 1 << 32 | 7, 493_000 << 32 | 12_345, (1 << HANDLE_BITS) - 1]
    issued = [2393774031703241099, 2207164226572558264, 282425651336130263, 733767847889472675,
              2001020080158264850]
    assert cipher.encode(wheel_handles) == issued
    assert cipher.decode(issued) == wheel_handles


def test_the_first_barrier_sets_the_key_once_and_a_manifest_keeps_it(tmp_path: Path) -> None:
    state = StateMachine.open(tmp_path / "a", StateConfig(), fresh=True)
    assert state.handle_key is None
    state.apply(commands.barrier(T0_MS, Cursor(0, 0), b"k" * 16))
    state.apply(commands.barrier(T0_MS, state.cursor, b"x" * 16))  # a later leader's
    state.apply(commands.barrier(T0_MS, state.cursor))
    assert state.handle_key == b"k" * 16
    manifest = state.manifest()
    state.close()
    other = StateMachine.open(tmp_path / "b", StateConfig(), fresh=True)
    other.install(manifest, lambda path, offset, size: b"")
    assert other.handle_key == b"k" * 16
    other.close()
