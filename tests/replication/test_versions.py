"""The cluster version's pieces without processes: the members' version stamps on Raft
messages, the finalize check's refusals, the snapshot manifest's parts by version, and a
finalize of a version this build does not know. The real cluster, forward and back:
test_rollback.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tickwheel.common.errors import InvariantViolation
from tickwheel.common.versions import BASELINE, CURRENT
from tickwheel.replication import commands
from tickwheel.replication.raft.versions import VERSION, MemberVersion, MemberVersions, older
from tickwheel.replication.state import StateConfig, StateMachine
from tickwheel.replication.state_files import Manifest, ShardMapRecord, manifest_of, manifest_parts
from tickwheel.wheel import Cursor


def test_answers_and_appends_carry_the_version_and_one_without_counts_as_0_0_4() -> None:
    sender, leader = MemberVersions(), MemberVersions(clock_s=lambda: 7.0)
    answer = {"type": "next_node_idx", "next_node_idx": 3}
    sender.outgoing(answer)
    sender.outgoing(vote := {"type": "request_vote"})
    assert answer[VERSION] == CURRENT and VERSION not in vote
    leader.incoming("a", answer)
    assert VERSION not in answer, "taken off before pysyncobj reads it"
    leader.incoming("b", {"type": "next_node_idx"})  # a node of 0.0.4
    leader.incoming("c", {"type": "append_entries", VERSION: "2"})  # malformed
    assert leader.heard == {"a": MemberVersion(CURRENT, 7.0), "b": MemberVersion(BASELINE, 7.0),
                            "c": MemberVersion(BASELINE, 7.0)}


def test_finalize_is_held_back_by_an_older_member_or_one_not_heard_lately() -> None:
    heard = {"a": MemberVersion(CURRENT, 10.0), "b": MemberVersion(BASELINE, 10.0)}
    assert "member b" in (older(heard, ["a", "b"], CURRENT, 5.0, 11.0) or "")
    assert "member c" in (older(heard, ["a", "c"], CURRENT, 5.0, 11.0) or "")
    assert "member a" in (older(heard, ["a"], CURRENT, 5.0, 16.0) or "")
    assert older(heard, ["a"], CURRENT, 5.0, 11.0) is None


def manifest(version: int, shard_map: ShardMapRecord | None = None) -> Manifest:
    return Manifest(Cursor(5, 0), 1_000, {"wheel/meta": 10}, (1, {}, {}),
                    shard_map=shard_map, cluster_version=version)


def test_a_snapshot_keeps_the_eight_parts_0_0_4_reads_until_finalized() -> None:
    assert len(manifest_parts(manifest(BASELINE))) == 8
    assert manifest_of(manifest_parts(manifest(BASELINE))).cluster_version == BASELINE
    grown = ShardMapRecord(2, 1_000, b"{}")
    parts = manifest_parts(manifest(CURRENT, grown))
    assert len(parts) == 10
    assert manifest_of(parts) == manifest(CURRENT, grown)
    with pytest.raises(InvariantViolation):  # no shard map can be set before version 2
        manifest_parts(manifest(BASELINE, grown))


def test_a_finalize_past_this_build_stops_the_replica(tmp_path: Path) -> None:
    state = StateMachine.open(tmp_path, StateConfig(), fresh=True)
    try:
        assert state.apply(commands.finalize(1_000, CURRENT)) == CURRENT
        assert state.manifest().cluster_version == CURRENT
        with pytest.raises(InvariantViolation, match="finalized at version 3"):
            state.apply(commands.finalize(1_000, CURRENT + 1))
    finally:
        state.close()
