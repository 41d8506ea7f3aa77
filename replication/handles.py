"""The handles clients see: a keyed permutation of the wheel's, so they cannot be guessed.

A wheel handle is ``hour << 32 | sequence``: whoever saw one handle could name its
neighbours, and a blind `Cancel` of made-up handles hit 5 of 5. Clients therefore get
``HandleCipher.encode(handle)``, a permutation of the 62-bit numbers (so a handle stays a
positive ``int64`` on the wire) keyed by the cluster's *handle key*: 16 random bytes the first
leader puts in its barrier, replicated and kept in snapshots like everything else, the same on
every node and across restarts.

The permutation is a balanced Feistel network of four rounds over two 31-bit halves, each round
function AES-128 of ``(round, half)`` under the key (Luby-Rackoff: four rounds of a
pseudo-random function give a strong pseudo-random permutation). Without the key, a guessed
handle names a message with probability (messages pending) / 2^62; one that decodes to a handle
the wheel never issued is refused as such.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from tickwheel.common.errors import invariant
from tickwheel.replication.commands import HANDLE_KEY_BYTES

HANDLE_BITS: Final = 62
"""Client handles (and the wheel handles they stand for) are below 2^62."""
_HALF_BITS: Final = HANDLE_BITS // 2
_HALF_MASK: Final = (1 << _HALF_BITS) - 1
_ROUNDS: Final = 4


class HandleCipher:
    """Encode wheel handles for clients and decode what clients send back."""

    def __init__(self, key: bytes) -> None:
        invariant(len(key) == HANDLE_KEY_BYTES, f"a handle key has {HANDLE_KEY_BYTES} bytes")
        self._cipher = Cipher(algorithms.AES(key), modes.ECB())

    def encode(self, handles: Sequence[int]) -> list[int]:
        """Client handles of these wheel handles (each below 2^62)."""
        if handles:
            lowest, highest = min(handles), max(handles)
            invariant(lowest >= 0 and highest < 1 << HANDLE_BITS,
                      f"wheel handles {lowest}..{highest} out of range")
        lefts = [h >> _HALF_BITS for h in handles]
        rights = [h & _HALF_MASK for h in handles]
        for number in range(_ROUNDS):  # (L, R) -> (R, L ^ F(R))
            mixed = self._round(number, rights)
            lefts, rights = rights, [left ^ f for left, f in zip(lefts, mixed, strict=True)]
        return [left << _HALF_BITS | right for left, right in zip(lefts, rights, strict=True)]

    def decode(self, handles: Sequence[int]) -> list[int | None]:
        """The wheel handles these client handles stand for; None for a number no client
        handle can be (negative, or 2^62 and above)."""
        valid = [h for h in handles if 0 <= h < 1 << HANDLE_BITS]
        lefts = [h >> _HALF_BITS for h in valid]
        rights = [h & _HALF_MASK for h in valid]
        for number in reversed(range(_ROUNDS)):  # undoes a round: (L, R) -> (R ^ F(L), L)
            mixed = self._round(number, lefts)
            lefts, rights = [right ^ f for right, f in zip(rights, mixed, strict=True)], lefts
        decoded = iter(left << _HALF_BITS | right
                       for left, right in zip(lefts, rights, strict=True))
        return [next(decoded) if 0 <= h < 1 << HANDLE_BITS else None for h in handles]

    def _round(self, number: int, halves: list[int]) -> list[int]:
        """The round function of every half at once: one AES call for the whole batch, its
        blocks (``round, half`` as two little-endian u64) packed and unpacked in one call
        each (a struct call per block was half the cost of handing out a message's handle)."""
        if not halves:
            return []
        words = [number, 0] * len(halves)
        words[1::2] = halves
        layout = f"<{len(words)}Q"
        encryptor = self._cipher.encryptor()
        out = encryptor.update(struct.pack(layout, *words)) + encryptor.finalize()
        return [word & _HALF_MASK for word in struct.unpack(layout, out)[::2]]
