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

In a cluster of several shards, each shard has a key of its own, and the handles of shards
other than 0 name their shard in clear (`SHARD_SHIFT`) above a permutation of 54 bits (27-bit
halves): a guess then hits with probability (messages pending) / 2^54.
"""

from __future__ import annotations

import functools
import threading
from array import array
from collections.abc import Sequence
from typing import Final

from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes

from tickwheel.common.errors import invariant
from tickwheel.replication.commands import HANDLE_KEY_BYTES

HANDLE_BITS: Final = 62
"""Client handles of shard 0 (and the wheel handles they stand for) are below 2^62."""
MAX_SHARDS: Final = 256
SHARD_FLAG_BIT: Final = 62
SHARD_SHIFT: Final = 54
"""A client handle of shard k >= 1 is ``1 << SHARD_FLAG_BIT | k << SHARD_SHIFT`` and a
permutation of the 54-bit numbers (wheel handles of hours before the year 2448): the shard is
readable, so that a client sends a cancel straight to it (`tickwheel.client.shards` reads it
the same way; a test holds the two to one layout)."""
_ROUNDS: Final = 4


class HandleCipher:
    """Encode wheel handles for clients and decode what clients send back."""

    def __init__(self, key: bytes, shard: int = 0) -> None:
        invariant(len(key) == HANDLE_KEY_BYTES, f"a handle key has {HANDLE_KEY_BYTES} bytes")
        invariant(0 <= shard < MAX_SHARDS, f"shard {shard} is not below {MAX_SHARDS}")
        self._cipher = Cipher(algorithms.AES(key), modes.ECB())
        self._contexts = threading.local()
        self.shard = shard
        self._bits = HANDLE_BITS if shard == 0 else SHARD_SHIFT
        self._half_bits = self._bits // 2
        self._tag = 0 if shard == 0 else (1 << SHARD_FLAG_BIT | shard << SHARD_SHIFT)

    def _encryptor(self) -> CipherContext:
        """This thread's AES context. ECB keeps no state between blocks, so one context serves
        every call; making one per call was a third of the cost of encoding a few handles. Not
        shared between threads: a context is not safe to use from two at once."""
        encryptor: CipherContext | None = getattr(self._contexts, "encryptor", None)
        if encryptor is None:
            encryptor = self._contexts.encryptor = self._cipher.encryptor()
        return encryptor

    def encode(self, handles: Sequence[int]) -> list[int]:
        """Client handles of these wheel handles (each below 2^62, or 2^54 on a shard
        other than 0)."""
        if not handles:
            return []
        lowest, highest = min(handles), max(handles)
        invariant(lowest >= 0 and highest < 1 << self._bits,
                  f"wheel handles {lowest}..{highest} out of range")
        half_bits = self._half_bits
        left, right = _halves(handles, half_bits)
        count, encryptor = len(handles), self._encryptor()
        for number in range(_ROUNDS):  # (L, R) -> (R, L ^ F(R))
            left, right = right, left ^ _round(encryptor, number, right, count, half_bits)
        encoded = _whole(left, right, count, half_bits)
        tag = self._tag
        return [tag | handle for handle in encoded] if tag else encoded

    def decode(self, handles: Sequence[int]) -> list[int | None]:
        """The wheel handles these client handles stand for; None for a number no client
        handle of this shard can be (negative, 2^62 and above, or another shard's)."""
        bits, tag = self._bits, self._tag
        mine = [0 <= h < 1 << HANDLE_BITS + 1 and h >> bits << bits == tag for h in handles]
        valid = [h ^ tag for h, ok in zip(handles, mine, strict=True) if ok]
        count = len(valid)
        if not count:
            return [None] * len(handles)
        half_bits = self._half_bits
        left, right = _halves(valid, half_bits)
        encryptor = self._encryptor()
        for number in reversed(range(_ROUNDS)):  # undoes a round: (L, R) -> (R ^ F(L), L)
            left, right = right ^ _round(encryptor, number, left, count, half_bits), left
        decoded = iter(_whole(left, right, count, half_bits))
        return [next(decoded) if ok else None for ok in mine]


def _round(encryptor: CipherContext, number: int, halves: int, count: int,
           half_bits: int) -> int:
    """The round function of every half at once, the halves packed as one integer (see
    `_joined`): one AES call (ECB: blocks apart, so one context serves every round) for the
    whole batch on the blocks ``(round, half)`` (two little-endian u64 each), its outputs'
    first words masked to ``half_bits`` bits. Every step is a C call on the whole batch: a Python
    operation per half and round was most of the cost of handing out a message's handle."""
    words = array("Q", (number, 0)) * count
    words[1::2] = array("Q", halves.to_bytes(8 * count, "little"))
    out = array("Q", encryptor.update(words.tobytes()))[::2]
    return int.from_bytes(out.tobytes(), "little") & _mask(count, half_bits)


def _halves(handles: Sequence[int], half_bits: int) -> tuple[int, int]:
    """The high and the low halves of ``handles``, each side joined into one integer (see
    `_joined`)."""
    mask = (1 << half_bits) - 1
    return (_joined([h >> half_bits for h in handles]), _joined([h & mask for h in handles]))


def _whole(left: int, right: int, count: int, half_bits: int) -> list[int]:
    """The ``count`` numbers whose halves `_halves` joined into ``left`` and ``right``."""
    return [high << half_bits | low
            for high, low in zip(_split(left, count), _split(right, count), strict=True)]


def _joined(halves: list[int]) -> int:
    """Halves as one integer, a 64-bit little-endian word each, so that a round's XOR of all
    of them is one operation."""
    return int.from_bytes(array("Q", halves).tobytes(), "little")


def _split(joined: int, count: int) -> array[int]:
    return array("Q", joined.to_bytes(8 * count, "little"))


@functools.lru_cache(maxsize=32)
def _mask(count: int, half_bits: int) -> int:
    """``count`` words of a half's mask, joined."""
    return int.from_bytes(((1 << half_bits) - 1).to_bytes(8, "little") * count, "little")
