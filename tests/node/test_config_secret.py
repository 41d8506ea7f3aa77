"""Where a node's Raft secret may come from, and what it refuses (no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tickwheel.node.settings.config import NodeSettings

THREE = ["127.0.0.1:7500=127.0.0.1:7400=127.0.0.1:7600",
         "127.0.0.1:7501=127.0.0.1:7401=127.0.0.1:7601",
         "127.0.0.1:7502=127.0.0.1:7402=127.0.0.1:7602"]
SECRET = "Zm9yLXRlc3RzLW9ubHktMzItYnl0ZXMtb2YtcmFuZG9t"


@pytest.fixture(autouse=True)
def no_tickwheel_environment(tls_env: pytest.MonkeyPatch) -> None:
    """No Raft secret or members from the environment; TLS files that exist."""
    monkeypatch = tls_env
    for name in ("TICKWHEEL_RAFT_SECRET", "TICKWHEEL_RAFT_SECRET_FILE",
                 "TICKWHEEL_INSECURE_RAFT", "TICKWHEEL_MEMBERS"):
        monkeypatch.delenv(name, raising=False)


def test_a_secret_file_s_white_space_is_not_part_of_the_secret(tmp_path: Path) -> None:
    path = tmp_path / "raft.secret"
    path.write_text(f"  {SECRET}\n")
    settings = NodeSettings(members=THREE, raft_secret_file=path)
    assert settings.raft_secrets() == (SECRET.encode(),)
    assert settings.replica_config().raft.secrets == (SECRET.encode(),)


def test_during_a_rotation_two_secrets_are_given_the_one_to_dial_with_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TICKWHEEL_RAFT_SECRET", f"{SECRET}-new {SECRET}")
    settings = NodeSettings(members=THREE)
    assert settings.raft_secrets() == (f"{SECRET}-new".encode(), SECRET.encode())


def test_a_cluster_without_a_secret_is_refused_and_told_how_to_fix_it() -> None:
    with pytest.raises(ValidationError, match="needs a Raft secret") as raised:
        NodeSettings(members=THREE)
    assert "--raft-secret-file" in str(raised.value)
    assert "--insecure-raft" in str(raised.value)


def test_a_node_alone_needs_no_secret_and_insecure_must_be_asked_for() -> None:
    assert NodeSettings().raft_secrets() == ()
    assert NodeSettings().replica_config().raft.insecure is False
    assert NodeSettings(members=THREE, insecure_raft=True).replica_config().raft.insecure


@pytest.mark.parametrize(("given", "error"), [
    ({"raft_secret": "short"}, "fewer than 16"),
    ({"raft_secret": f"{SECRET} short"}, "fewer than 16"),
    ({"raft_secret": "   "}, "is empty"),
    ({"raft_secret": SECRET, "insecure_raft": True}, "insecure_raft with a Raft secret"),
    ({"raft_secret_file": Path("/nonexistent/raft.secret")}, "No such file"),
])
def test_bad_secrets_are_refused_naming_what_is_wrong(given: dict, error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        NodeSettings(members=THREE, **given)


def test_a_secret_and_a_secret_file_together_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "raft.secret"
    path.write_text(SECRET)
    with pytest.raises(ValidationError, match="both given"):
        NodeSettings(members=THREE, raft_secret=SECRET, raft_secret_file=path)


def test_the_secret_never_shows_in_the_settings_repr() -> None:
    settings = NodeSettings(members=THREE, raft_secret=SECRET)
    assert SECRET not in repr(settings)
    assert SECRET not in str(settings.model_dump())


def test_the_schedule_linger_reaches_the_replica_and_zero_turns_it_off() -> None:
    assert NodeSettings().replica_config().schedule_linger_ms == 12
    assert NodeSettings(schedule_linger_ms=0).replica_config().schedule_linger_ms == 0
    with pytest.raises(ValidationError, match="must be 0 or more"):
        NodeSettings(schedule_linger_ms=-1)


def test_the_group_and_reschedule_bounds_reach_the_replicated_state() -> None:
    state = NodeSettings(max_ready_msgs=7, max_groups=3, max_moved_msgs=5).replica_config().state
    assert (state.max_ready_msgs, state.max_groups, state.max_moved_msgs) == (7, 3, 5)
    with pytest.raises(ValidationError, match="must be positive"):
        NodeSettings(max_moved_msgs=0)


def test_the_dedupe_windows_bound_is_a_setting() -> None:
    """The largest term of a leader's memory (docs/node.md, "Memory"): before, a constant."""
    assert NodeSettings().replica_config().state.max_dedupe_ids == 2_000_000
    assert NodeSettings(max_dedupe_ids=1_000).replica_config().state.max_dedupe_ids == 1_000
    with pytest.raises(ValidationError, match="must be positive"):
        NodeSettings(max_dedupe_ids=0)
