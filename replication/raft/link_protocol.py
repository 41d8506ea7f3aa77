"""The Raft link protocol: how two members prove the shared secret to each other, the keys
that follow from it, the frames, and what a frame may unpickle into.
`tickwheel.replication.raft.wire` runs it over sockets.

1. The dialler sends ``HELLO``: magic, version, which secret it uses (an 8-byte HMAC of the
   key: during a rotation an acceptor takes an old and a new one) and a fresh 32-byte nonce
   ``nc`` (45 bytes).
2. The acceptor answers ``WELCOME``: its own nonce ``ns`` and ``HMAC(K, "S" | nc | ns)``
   (69 bytes), proving it knows that secret.
3. The dialler checks that proof and sends ``HMAC(K, "C" | nc | ns)`` (32 bytes).

``K`` is HKDF-SHA256 of the shared secret. Each direction then has its own AES-256-GCM key
(HKDF of ``K`` salted with both nonces), and each frame is ``length (u32) | AES-GCM(counter
nonce, pickle)``: a frame from anyone without the secret, replayed, reordered or altered fails
its tag before anything is unpickled. What a member sends is unpickled by `safe_loads`, which
builds plain data only (no classes, no functions): not even a member can make a node run code.

``insecure`` (one explicit node flag) keeps the handshake with an empty secret and sends frames
in the clear: anyone can then join, read and write the Raft traffic, but the frame bounds and
`safe_loads` still hold. A secure node and an insecure one fail each other's handshake.
"""

from __future__ import annotations

import hmac
import io
import pickle
import struct
from dataclasses import dataclass, field
from hashlib import sha256

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

MAGIC = b"TWRL"
VERSION = 1
NONCE_BYTES = 32
MAC_BYTES = 32
KEY_ID_BYTES = 8
HELLO = struct.Struct(f"!4sB{KEY_ID_BYTES}s{NONCE_BYTES}s")
"""Dialler -> acceptor: magic, version, the id of the dialler's key, the dialler's nonce."""
WELCOME = struct.Struct(f"!4sB{NONCE_BYTES}s{MAC_BYTES}s")
"""Acceptor -> dialler: magic, version, the acceptor's nonce, its proof."""
PROOF_BYTES = MAC_BYTES
"""Dialler -> acceptor: the dialler's proof."""
FRAME_HEAD = struct.Struct("!I")
"""Every frame after the handshake: the length of what follows (ciphertext and tag)."""
PICKLE_PROTOCOL = 5


@dataclass(frozen=True, slots=True)
class LinkSettings:
    """What every link of a node shares."""

    secrets: tuple[bytes, ...]
    """The cluster's shared secrets: a link is dialled with the first and accepted with any
    (during a rotation, the old and the new one); ``(b"",)`` only with ``insecure``."""
    insecure: bool = False
    """No secret: frames in the clear, anyone may join (one explicit flag, loudly logged)."""
    max_frame_bytes: int = 20 << 20
    handshake_timeout_ms: int = 5_000
    max_unauthenticated: int = 16
    idle_timeout_ms: int = 10_000
    """A link that received nothing this long is dropped (pysyncobj redials it)."""
    send_buffer_bytes: int = 1 << 20
    recv_buffer_bytes: int = 1 << 20
    keys: dict[bytes, bytes] = field(init=False, repr=False, compare=False)
    """Key id -> key, the dialling key first: derived once, not for every link (an acceptor
    would otherwise run HKDF for every stranger that connects)."""

    def __post_init__(self) -> None:
        if not self.secrets or self.insecure != (self.secrets == (b"",)) or (
                not self.insecure and not all(self.secrets)):
            raise ValueError("a Raft link needs secrets, or insecure without any")
        object.__setattr__(self, "keys", {key_id(key): key
                                          for key in map(master_key, self.secrets)})


def master_key(secret: bytes) -> bytes:
    """The key a secret stands for: HKDF-SHA256, so that any secret makes a uniform key."""
    return _hkdf(secret, b"tickwheel", b"raft-link-v1")


def key_id(key: bytes) -> bytes:
    """What a dialler says of its key: enough to pick it, nothing to learn it from."""
    return hmac.new(key, b"key-id", sha256).digest()[:KEY_ID_BYTES]


class SafeUnpickler(pickle.Unpickler):
    """Builds plain data only: any class or function named in the pickle is refused."""

    allowed: frozenset[tuple[str, str]] = frozenset()

    def find_class(self, module: str, name: str) -> object:
        if (module, name) in self.allowed:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def safe_loads(data: bytes) -> object:
    """``pickle.loads`` for data a peer sent: dicts, lists, tuples, sets, str, bytes, numbers,
    booleans and None, nothing that runs code."""
    return SafeUnpickler(io.BytesIO(data)).load()


def safe_load(file: io.BufferedIOBase, allowed: frozenset[tuple[str, str]]) -> object:
    """`safe_loads` from a file, also building the ``(module, name)`` classes in ``allowed``."""
    unpickler = SafeUnpickler(file)
    unpickler.allowed = allowed
    return unpickler.load()


def proof(key: bytes, label: bytes, dialler_nonce: bytes, acceptor_nonce: bytes) -> bytes:
    """``HMAC(K, label | nc | ns)``: ``b"S"`` from the acceptor, ``b"C"`` from the dialler."""
    return hmac.new(key, label + dialler_nonce + acceptor_nonce, sha256).digest()


def ciphers(key: bytes, dialler_nonce: bytes, acceptor_nonce: bytes, *, dialler: bool
            ) -> tuple[AESGCM, AESGCM]:
    """This side's (sending, receiving) ciphers of one link."""
    salt = dialler_nonce + acceptor_nonce
    outbound = _hkdf(key, salt, b"dialler->acceptor")
    inbound = _hkdf(key, salt, b"acceptor->dialler")
    if not dialler:
        outbound, inbound = inbound, outbound
    return AESGCM(outbound), AESGCM(inbound)


def frame_nonce(counter: int) -> bytes:
    """The AES-GCM nonce of a direction's ``counter``-th frame (each direction has its key)."""
    return counter.to_bytes(12, "big")


def _hkdf(key: bytes, salt: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=info).derive(key)
