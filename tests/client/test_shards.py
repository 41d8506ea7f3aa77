"""The placement rules clients and nodes share (`tickwheel.client.shards`), the shard a handle and
a receipt carry, and how a node's settings name the shards. No process starts here."""

from __future__ import annotations

import hashlib
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tickwheel.client.routing import ShardRouters, receive_slices, split
from tickwheel.client.shards import (
    MAX_SHARDS,
    handle_shard,
    jump_hash,
    key_hash,
    receipt_shard,
    shard_of,
)
from tickwheel.common.errors import InvalidMessage
from tickwheel.node.settings.config import NodeSettings
from tickwheel.node.settings.shards import shard_map
from tickwheel.replication import HandleCipher, LeaseRef, decode_receipt, encode_receipts
from tickwheel.replication.handle_cipher import SHARD_FLAG_BIT as CIPHER_FLAG_BIT
from tickwheel.replication.handle_cipher import SHARD_SHIFT as CIPHER_SHIFT


def test_an_id_lands_on_the_same_shard_in_every_process_and_release() -> None:
    # Pinned: a change here would send the retries of messages already scheduled in a
    # running cluster to another shard, past the idempotency window of the first.
    assert key_hash("order-42") == 0xF3C9061A76B5AE94
    assert [shard_of(f"order-{n}", 4) for n in range(12)] == [3, 1, 3, 0, 1, 3, 3, 1, 1, 0, 0, 3]
    assert [shard_of(f"order-{n}", 2) for n in range(12)] == [1, 1, 1, 0, 1, 1, 0, 1, 1, 0, 0, 0]
    assert shard_of("anything", 1) == 0


SHARDS_DOC = Path(__file__).resolve().parents[2] / "docs" / "shards.md"


def _documented_rule() -> dict[str, Any]:
    """The functions of docs/shards.md's code block, as a third party would copy them."""
    code = re.search(r"```python\n(.*?def jump_hash.*?)```", SHARDS_DOC.read_text(), re.S)
    assert code is not None
    namespace: dict[str, Any] = {}
    exec(compile(code.group(1), str(SHARDS_DOC), "exec"), namespace)
    return namespace


@given(st.text(min_size=1, max_size=40), st.integers(1, MAX_SHARDS))
def test_the_documented_code_places_keys_as_the_nodes_do(key: str, shards: int) -> None:
    documented = _documented_rule()
    assert documented["key_hash"](key) == key_hash(key)
    assert documented["shard_of"](key, shards) == shard_of(key, shards)


def test_the_documented_worked_examples_are_the_rule() -> None:
    text = SHARDS_DOC.read_text()
    rows = re.findall(r"^\| `([^`]+)` \| `([0-9a-f]{16})` \| `(0x[0-9a-f]{16})` \| (\d+) \| "
                      r"(\d+) \| (\d+) \|$", text, re.M)
    assert len(rows) >= 6
    assert any(not key.isascii() for key, *_ in rows)  # UTF-8, not Latin-1 or UTF-16
    for key, digest, number, *shards in rows:
        assert hashlib.blake2b(key.encode("utf-8"), digest_size=8).hexdigest() == digest, key
        assert key_hash(key) == int(number, 16), key
        assert [shard_of(key, count) for count in (2, 3, 4)] == [int(s) for s in shards], key
    # the contrast the page draws: BLAKE2b-512 cut to 8 bytes is another hash
    assert f"`{hashlib.blake2b(b'order-42').hexdigest()[:16]}`" in text
    assert "`" + "café-7".encode().hex() + "`" in text


def test_ids_spread_evenly_over_the_shards() -> None:
    counts = Counter(shard_of(os.urandom(8).hex(), 4) for _ in range(20_000))
    assert set(counts) == {0, 1, 2, 3}
    assert all(4_600 <= count <= 5_400 for count in counts.values()), counts


@given(st.integers(min_value=0, max_value=(1 << 64) - 1), st.integers(1, 64))
def test_growing_the_shards_moves_a_key_only_to_a_new_shard(key: int, shards: int) -> None:
    before, after = jump_hash(key, shards), jump_hash(key, shards + 1)
    assert 0 <= before < shards
    assert after in (before, shards)


def test_a_handle_names_its_shard_and_shard_0_keeps_the_handles_of_one_shard() -> None:
    key = bytes(range(16))
    wheel_handles = [(490_000 << 32) | n for n in range(0, 5_000, 7)]
    single = HandleCipher(key)
    assert HandleCipher(key, 0).encode(wheel_handles) == single.encode(wheel_handles)
    assert all(0 <= h < 1 << 62 and handle_shard(h) == 0 for h in single.encode(wheel_handles))
    for shard in (1, 7, MAX_SHARDS - 1):
        cipher = HandleCipher(key, shard)
        handles = cipher.encode(wheel_handles)
        assert all(0 < h < 1 << 63 and handle_shard(h) == shard for h in handles)
        assert cipher.decode(handles) == wheel_handles
        assert len(set(handles)) == len(handles)
        # another shard's cipher (with the same key, even) takes none of them
        assert HandleCipher(key, shard - 1).decode(handles) == [None] * len(handles)
        assert cipher.decode(single.encode(wheel_handles)) == [None] * len(handles)
    assert (CIPHER_FLAG_BIT, CIPHER_SHIFT) == (62, 54)  # the layout handle_shard reads
    assert handle_shard(-1) == 0 and handle_shard(-(1 << 62)) == 0


def test_a_receipt_names_its_shard_and_another_shard_refuses_it() -> None:
    lease = LeaseRef(3, 42, 1, 0xDEADBEEF)
    plain, = encode_receipts([lease])
    sharded, = encode_receipts([lease], 5)
    assert "." not in plain and receipt_shard(plain) == 0
    assert sharded == f"5.{plain}" and receipt_shard(sharded) == 5
    assert decode_receipt(plain, "r") == decode_receipt(sharded, "r", 5) == lease
    with pytest.raises(InvalidMessage, match="shard '5'"):
        decode_receipt(sharded, "ack.receipts[0]", 4)
    with pytest.raises(InvalidMessage, match="shard 0"):
        decode_receipt(plain, "ack.receipts[0]", 5)
    with pytest.raises(InvalidMessage, match="shard '5'"):
        decode_receipt(sharded, "ack.receipts[0]", 0)
    assert receipt_shard("999.x") == 0 and receipt_shard("x.y") == 0


def test_a_client_keeps_a_router_per_shard_and_splits_a_request_by_shard() -> None:
    routers = ShardRouters("a:1")
    assert routers.count == 1 and not routers.known
    routers.learn([(["a:1", "b:1"], "b:1"), (["c:1", "d:1"], "")])
    assert routers.count == 2 and routers.known
    assert routers.routers[0].choose() == "b:1" and routers.routers[1].leader is None
    assert routers.shard_of_handle(1 << 62 | 9 << 54) == 0  # no shard 9 here: shard 0 refuses
    parts = split([1, 0, 1, 1, 0])
    assert parts == {1: [0, 2, 3], 0: [1, 4]}
    one = ShardRouters("a:1")
    one.learn([])  # a cluster of one shard keeps the router of the given targets
    assert one.count == 1 and one.routers[0].targets == ["a:1"]


def test_a_receive_asks_every_shard_at_once_then_waits_a_slice_at_each_in_turn() -> None:
    assert receive_slices(1, 5, 3_000) == [(0, 3_000)]
    slices = receive_slices(2, 1, 1_600)
    assert slices[:2] == [(1, 0), (0, 0)]
    assert slices[2:] == [(1, 500), (0, 500), (1, 500), (0, 100)]
    assert receive_slices(3, 0, 0) == [(0, 0), (1, 0), (2, 0)]


def test_a_nodes_shard_settings_are_checked() -> None:
    own = ["10.0.0.1:7400", "10.0.0.2:7400"]
    assert shard_map(0, [], own).members == (tuple(own),)
    both = shard_map(1, ["0=10.0.1.1:7400", "1=10.0.0.2:7400", "1=10.0.0.1:7400"], own)
    assert both.members == (("10.0.1.1:7400",), tuple(own)) and both.shard == 1
    for shard, entries, problem in [
            (1, [], "no member of shard 0"),
            (0, ["2=10.0.2.1:7400"], "no member of shard 1"),
            (0, ["1=10.0.0.1:7400"], "listed in shards 0 and 1"),
            (0, ["0=10.0.9.9:7400"], "for this node's shard 0"),
            (0, ["one=10.0.1.1:7400"], "is not SHARD=GRPC_ADDRESS"),
            (0, ["1=10.0.1.1:7400=10.0.1.1:7600=x"], "or SHARD=GRPC_ADDRESS=PEER_ADDRESS"),
            (MAX_SHARDS, [], "is not 0 to")]:
        with pytest.raises(ValueError, match=problem):
            shard_map(shard, entries, own)
    settings = NodeSettings(shard=1, shard_members="0=127.0.0.1:7401,0=127.0.0.1:7402",
                            grpc_listen="127.0.0.1:7400", insecure_grpc=True)
    assert settings.shard_map().count == 2 and settings.replica_config().shard == 1
    with pytest.raises(ValueError, match="no member of shard 0"):
        NodeSettings(shard=1, insecure_grpc=True)


def test_the_map_keeps_each_members_peer_listener_when_given() -> None:
    """A node reaches another shard's leader through its peer listener (the RocketMQ
    listener's sends): the map keeps each member's, from the entries and its own members."""
    found = shard_map(0, ["1=10.0.1.1:7400=10.0.1.1:7600", "1=10.0.1.2:7400=10.0.1.2:7600"],
                      ["10.0.0.1:7400"], own_peers=["10.0.0.1:7600"])
    assert found.peers == (("10.0.0.1:7600",), ("10.0.1.1:7600", "10.0.1.2:7600"))
    assert shard_map(0, ["1=10.0.1.1:7400"], ["10.0.0.1:7400"]).peers == (("",), ("",))
    members = "10.0.0.1:7500=10.0.0.1:7400=10.0.0.1:7600"
    with pytest.raises(ValueError, match="give every shard_members entry as SHARD=GRPC=PEER"):
        NodeSettings(members=[members], raft_address="10.0.0.1:7500", shard_members="1=b:7400",
                     rocketmq_listen="127.0.0.1:8081", insecure_raft=True, insecure_grpc=True)
    settings = NodeSettings(members=[members], raft_address="10.0.0.1:7500",
                            shard_members="1=b:7400=b:7600", rocketmq_listen="127.0.0.1:8081",
                            insecure_raft=True, insecure_grpc=True)
    assert settings.shard_map().peers == (("10.0.0.1:7600",), ("b:7600",))


def test_shard_k_prefers_its_kth_member_as_leader_and_one_shard_prefers_none() -> None:
    members = [f"10.0.0.{i}:7500=10.0.0.{i}:7400=10.0.0.{i}:7600" for i in (1, 2, 3)]
    for shard, shards, preferred in [(1, 4, "10.0.0.2:7500"), (3, 4, "10.0.0.1:7500"),
                                     (0, 1, None)]:
        others = ",".join(f"{k}=10.{k + 1}.0.{i}:7400" for k in range(shards) if k != shard
                          for i in (1, 2, 3))
        settings = NodeSettings(members=members, raft_address="10.0.0.1:7500", shard=shard,
                                shard_members=others, insecure_raft=True, insecure_grpc=True)
        assert settings.replica_config().raft.preferred_leader == preferred


def test_a_nodes_shard_count_is_checked_against_its_map() -> None:
    own = ["10.0.0.1:7400"]
    assert shard_map(1, ["0=10.0.1.1:7400"], own, shards=2).count == 2
    for shard, entries, shards, problem in [
            (0, [], 2, "shards is 2, but shard 0 and shard_members make a map of 1 shard:"),
            (1, ["0=10.0.1.1:7400", "2=10.0.2.1:7400"], 2, "make a map of 3 shards"),
            (0, [], 0, "shards must be 1 to 256, not 0"),
            (0, [], MAX_SHARDS + 1, "shards must be 1 to 256")]:
        with pytest.raises(ValueError, match=problem):
            shard_map(shard, entries, own, shards)
    with pytest.raises(ValueError, match="shards is 3"):
        NodeSettings(shards=3, insecure_grpc=True)


def test_a_node_of_a_shard_added_needs_its_map_version_and_the_old_shards_peers() -> None:
    """A shard added asks the old shards about ids through their peer listeners: a map
    without them, or a growth the version does not show, is refused at start."""
    members = "10.0.0.1:7500=10.0.0.1:7400=10.0.0.1:7600"
    common = {"members": [members], "raft_address": "10.0.0.1:7500", "shard": 2,
              "insecure_raft": True, "insecure_grpc": True}
    with pytest.raises(ValueError, match="grown_from: a shard added"):
        NodeSettings(**common, shard_members="0=a:7400,1=b:7400", shard_map_version=2,
                     grown_from=2)
    with pytest.raises(ValueError, match="only a version above 1 grew"):
        NodeSettings(**common, shard_members="0=a:7400=a:7600,1=b:7400=b:7600", grown_from=2)
    with pytest.raises(ValueError, match="grown_from is 3"):
        NodeSettings(**common, shard_members="0=a:7400=a:7600,1=b:7400=b:7600",
                     shard_map_version=2, grown_from=3)
    grown = NodeSettings(**common, shard_members="0=a:7400=a:7600,1=b:7400=b:7600",
                         shard_map_version=2, grown_from=2).shard_map()
    assert (grown.version, grown.grown_from, grown.count) == (2, 2, 3)
