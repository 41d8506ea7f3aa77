"""The Raft link's handshake without sockets: both ends driven in memory, as `wire.Link`
drives them, step by step with exactly the bytes each step reads."""

from __future__ import annotations

import pytest
from cryptography.exceptions import InvalidTag

from tickwheel.replication.raft.handshake import OPEN, Handshake, Refused
from tickwheel.replication.raft.link_protocol import HELLO, LinkSettings


def keys(*secrets: bytes) -> dict[bytes, bytes]:
    return LinkSettings(secrets=secrets).keys


def run(dialler: Handshake, acceptor: Handshake) -> None:
    """Carry each end's answer to the other until both are open (or one refuses)."""
    to_acceptor, to_dialler = dialler.hello(), b""
    while dialler.step != OPEN or acceptor.step != OPEN:
        if to_acceptor:
            assert len(to_acceptor) == acceptor.wanted
            to_dialler, to_acceptor = acceptor.receive(to_acceptor), b""
        elif to_dialler:
            assert len(to_dialler) == dialler.wanted
            to_acceptor, to_dialler = dialler.receive(to_dialler), b""
        else:
            raise AssertionError("neither end has anything to say, and they are not open")


def test_both_ends_open_with_matching_keys_each_way() -> None:
    dialler = Handshake(keys(b"a shared secret!"), dialler=True)
    acceptor = Handshake(keys(b"a shared secret!"), dialler=False)
    run(dialler, acceptor)
    (d_send, d_recv), (a_send, a_recv) = dialler.ciphers(), acceptor.ciphers()
    nonce = bytes(12)
    assert a_recv.decrypt(nonce, d_send.encrypt(nonce, b"append", None), None) == b"append"
    assert d_recv.decrypt(nonce, a_send.encrypt(nonce, b"ok", None), None) == b"ok"
    with pytest.raises(InvalidTag):
        d_recv.decrypt(nonce, d_send.encrypt(nonce, b"own", None), None)  # directions differ


def test_an_acceptor_during_a_rotation_takes_the_old_and_the_new_secret() -> None:
    for dialling in (b"the old secret!!", b"the new secret!!"):
        acceptor = Handshake(keys(b"the new secret!!", b"the old secret!!"), dialler=False)
        run(Handshake(keys(dialling), dialler=True), acceptor)
        assert acceptor.step == OPEN


def test_a_dialler_with_another_secret_is_refused_at_its_hello() -> None:
    dialler = Handshake(keys(b"not the secret!!"), dialler=True)
    acceptor = Handshake(keys(b"a shared secret!"), dialler=False)
    with pytest.raises(Refused) as refused:
        acceptor.receive(dialler.hello())
    assert refused.value.reason == "wrong_secret"
    assert acceptor.step != OPEN


def test_an_acceptor_that_cannot_prove_the_secret_is_refused_by_the_dialler() -> None:
    """A stranger who copies a member's key id into its own welcome still cannot prove it."""
    dialler = Handshake(keys(b"a shared secret!"), dialler=True)
    impostor = Handshake(keys(b"a shared secret!"), dialler=False)
    welcome = bytearray(impostor.receive(dialler.hello()))
    welcome[-1] ^= 1  # the proof, one bit off
    with pytest.raises(Refused) as refused:
        dialler.receive(bytes(welcome))
    assert refused.value.reason == "wrong_secret"
    assert dialler.step != OPEN


def test_a_dialler_whose_final_proof_is_wrong_is_refused() -> None:
    dialler = Handshake(keys(b"a shared secret!"), dialler=True)
    acceptor = Handshake(keys(b"a shared secret!"), dialler=False)
    final = bytearray(dialler.receive(acceptor.receive(dialler.hello())))
    final[0] ^= 1
    with pytest.raises(Refused) as refused:
        acceptor.receive(bytes(final))
    assert refused.value.reason == "wrong_secret"
    assert acceptor.step != OPEN


def test_bytes_that_are_not_a_tickwheel_hello_are_refused() -> None:
    acceptor = Handshake(keys(b"a shared secret!"), dialler=False)
    with pytest.raises(Refused) as refused:
        acceptor.receive(b"GET / HTTP/1.1\r\n".ljust(HELLO.size, b"x"))
    assert refused.value.reason == "not_a_tickwheel_link"
