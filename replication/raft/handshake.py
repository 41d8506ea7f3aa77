"""The Raft link's handshake (`tickwheel.replication.raft.link_protocol`, steps 1-3) as a state
machine without sockets: `tickwheel.replication.raft.wire` feeds it exactly the bytes of each
step and sends what it answers, and a test can drive both ends in memory.

A step that fails raises `Refused` with the reason the link is dropped for; nothing of a
stranger's bytes is kept. Once both proofs check, `ciphers` gives the two directions' keys.
"""

from __future__ import annotations

import hmac
import os

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tickwheel.common.errors import InvariantViolation
from tickwheel.replication.raft.link_protocol import (
    HELLO,
    MAGIC,
    NONCE_BYTES,
    PROOF_BYTES,
    VERSION,
    WELCOME,
    ciphers,
    key_id,
    proof,
)

DIALING, AWAIT_HELLO, AWAIT_WELCOME, AWAIT_PROOF, OPEN = range(5)
"""The steps: a dialler waits for its socket to connect, then for the acceptor's welcome; an
acceptor waits for the hello, then for the dialler's proof; both end open."""
_STEP_BYTES = {AWAIT_HELLO: HELLO.size, AWAIT_WELCOME: WELCOME.size, AWAIT_PROOF: PROOF_BYTES}


class Refused(Exception):
    """The other end failed a step; ``reason`` names how."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Handshake:
    """One connection's handshake. ``keys``: key id -> key, the first the one a dialler
    uses (an acceptor takes any, during a secret's rotation)."""

    def __init__(self, keys: dict[bytes, bytes], *, dialler: bool) -> None:
        self._keys = keys
        self._master = next(iter(keys.values()))
        self.dialler = dialler
        self.step = DIALING if dialler else AWAIT_HELLO
        self._nonce = b""
        self._peer_nonce = b""

    @property
    def wanted(self) -> int | None:
        """How many bytes the step reads; None before the dialler's hello and once open."""
        return _STEP_BYTES.get(self.step)

    def hello(self) -> bytes:
        """The dialler's first message, once its socket connects."""
        self._nonce = os.urandom(NONCE_BYTES)
        self.step = AWAIT_WELCOME
        return HELLO.pack(MAGIC, VERSION, key_id(self._master), self._nonce)

    def receive(self, data: bytes) -> bytes:
        """Act on the step's ``wanted`` bytes; returns what to send (maybe nothing)."""
        if self.step == AWAIT_HELLO:
            return self._answer_hello(data)
        if self.step == AWAIT_WELCOME:
            return self._check_welcome(data)
        if self.step == AWAIT_PROOF:
            return self._check_proof(data)
        raise InvariantViolation(f"handshake bytes at step {self.step}")

    def ciphers(self) -> tuple[AESGCM, AESGCM]:
        """Once open: this end's sending and receiving keys."""
        nonces = ((self._nonce, self._peer_nonce) if self.dialler
                  else (self._peer_nonce, self._nonce))
        return ciphers(self._master, *nonces, dialler=self.dialler)

    def _answer_hello(self, hello: bytes) -> bytes:
        magic, version, their_key_id, self._peer_nonce = HELLO.unpack(hello)
        if magic != MAGIC or version != VERSION:
            raise Refused("not_a_tickwheel_link")
        if their_key_id not in self._keys:
            raise Refused("wrong_secret")
        self._master = self._keys[their_key_id]
        self._nonce = os.urandom(NONCE_BYTES)
        self.step = AWAIT_PROOF
        return WELCOME.pack(MAGIC, VERSION, self._nonce,
                            proof(self._master, b"S", self._peer_nonce, self._nonce))

    def _check_welcome(self, welcome: bytes) -> bytes:
        magic, version, self._peer_nonce, their_proof = WELCOME.unpack(welcome)
        if magic != MAGIC or version != VERSION:
            raise Refused("not_a_tickwheel_link")
        if not hmac.compare_digest(their_proof,
                                   proof(self._master, b"S", self._nonce, self._peer_nonce)):
            raise Refused("wrong_secret")
        self.step = OPEN
        return proof(self._master, b"C", self._nonce, self._peer_nonce)

    def _check_proof(self, their_proof: bytes) -> bytes:
        if not hmac.compare_digest(their_proof,
                                   proof(self._master, b"C", self._peer_nonce, self._nonce)):
            raise Refused("wrong_secret")
        self.step = OPEN
        return b""
