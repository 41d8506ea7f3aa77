"""Where a message lives in a cluster of several shards (independent Raft groups), and which
shard a handle or a receipt names: the placement rules clients and nodes share.

A message belongs to shard ``jump_hash(key_hash(key), shards)``, where the key is its routing
key, or its id when it has none: stable (the same id always lands on the same shard, which
keeps scheduling idempotent by id), spread evenly, and with the fewest moves when shards are
added (jump consistent hash, Lamping and Veach, 2014: growing from n to m shards moves only the
keys the new shards take). docs/shards.md spells the rule out for clients in other languages,
with worked examples that the tests check against this module. A handle of shard 0 is a
number below 2^62, as in a cluster of one shard; a handle of shard k >= 1 has bit 62 set and k
in bits 54-61. A receipt of shard k >= 1 starts with ``k.``; one of shard 0 has no prefix.
"""

from __future__ import annotations

import hashlib
from typing import Final

MAX_SHARDS: Final = 256
"""Shards a cluster may have: a handle keeps 8 bits for its shard."""
SHARD_FLAG_BIT: Final = 62
SHARD_SHIFT: Final = 54
"""A handle of shard k >= 1: ``1 << SHARD_FLAG_BIT | k << SHARD_SHIFT | (54 bits)``."""
_SHARD_MASK: Final = MAX_SHARDS - 1
_JUMP: Final = 2862933555777941757
_WORD: Final = (1 << 64) - 1


def key_hash(key: str) -> int:
    """The 64-bit hash a key is placed by: BLAKE2b of its UTF-8 bytes with an 8-byte digest
    (``digest_size=8``, which is not BLAKE2b-512 cut to 8 bytes), read as a little-endian
    unsigned integer. The same in every process and on every machine (Python's ``hash`` is
    salted per process)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def jump_hash(key: int, buckets: int) -> int:
    """Jump consistent hash (Lamping and Veach, 2014): the bucket of unsigned 64-bit ``key``
    among ``buckets``; the key's steps wrap modulo 2^64, the jump is in IEEE 754 doubles,
    truncated, as in the paper's C++."""
    bucket, jump = -1, 0
    while jump < buckets:
        bucket = jump
        key = (key * _JUMP + 1) & _WORD
        jump = int((bucket + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return bucket


def shard_of(key: str, shards: int) -> int:
    """The shard of a message whose routing key (or, without one, id) is ``key``."""
    return 0 if shards <= 1 else jump_hash(key_hash(key), shards)


def handle_shard(handle: int) -> int:
    """The shard that gave out ``handle`` (0 for any number that is no sharded handle)."""
    if handle >> SHARD_FLAG_BIT & 1 and handle >> 63 == 0:
        return handle >> SHARD_SHIFT & _SHARD_MASK
    return 0


def receipt_shard(receipt: str) -> int:
    """The shard that gave out ``receipt`` (0 for a receipt without a shard prefix, or a
    prefix that is no shard)."""
    prefix, dot, _ = receipt.partition(".")
    if not dot or not prefix.isdigit() or len(prefix) > 3:
        return 0
    shard = int(prefix)
    return shard if shard < MAX_SHARDS else 0


def shard_prefetch(prefetch: int, shards: int) -> int:
    """A consumer's ``prefetch`` shared among its ``shards`` streams: each has its part (at
    least one), so that a slow consumer holds about as many messages on many shards as on one,
    and no more of their leases run out before it acknowledges them."""
    return max(1, -(-prefetch // shards))
