"""The cluster's time (`tickwheel.replication.cluster_clock`) and the clock stamps it is built
from (`tickwheel.replication.raft.clocks`), without sockets."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from tickwheel.replication import ClusterClock
from tickwheel.replication.raft.clocks import WALL, PeerClocks
from tickwheel.replication.raft.port import PeerClock
from tickwheel.replication.raft.tenure import ECHO

TRUE_MS = 1_800_000_000_000


@dataclass
class Time:
    now_s: float = 100.0
    skew_ms: int = 0

    def now_ms(self) -> int:
        return TRUE_MS + int(self.now_s * 1000) + self.skew_ms

    def monotonic_s(self) -> float:
        return self.now_s


@dataclass
class Port:
    leading: bool = True
    clocks: dict[str, PeerClock] = field(default_factory=dict)

    def is_leader(self) -> bool:
        return self.leading

    def peer_clocks(self) -> dict[str, PeerClock]:
        return self.clocks


def answered(time: Time, peer_skew_ms: int, round_trip_ms: float) -> PeerClock:
    """A peer's answer read now, its clock read half a round trip ago."""
    read_ms = TRUE_MS + time.now_s * 1000 - round_trip_ms / 2 + peer_skew_ms
    return PeerClock(read_ms - time.now_s * 1000, round_trip_ms, time.now_s)


def three(own_skew_ms: int, peer_skews_ms: tuple[int, int], round_trip_ms: float = 4
          ) -> tuple[Time, Port, ClusterClock]:
    time = Time(skew_ms=own_skew_ms)
    port = Port(clocks={f"p{i}": answered(time, skew, round_trip_ms)
                        for i, skew in enumerate(peer_skews_ms)})
    return time, port, ClusterClock("me", time, port, 3, max_age_ms=500)


@pytest.mark.parametrize("own_skew_ms", [5_000, -5_000, 0])
def test_the_leaders_own_clock_far_off_changes_nothing(own_skew_ms: int) -> None:
    time, _, clock = three(own_skew_ms, (0, 0))
    true_ms = TRUE_MS + int(time.now_s * 1000)
    assert clock.agreed()
    assert true_ms - 4 <= clock.now_ms() <= true_ms  # never ahead; behind by a round trip


@pytest.mark.parametrize("peer_skew_ms", [60_000, -60_000])
def test_one_peer_far_off_changes_nothing(peer_skew_ms: int) -> None:
    time, _, clock = three(0, (peer_skew_ms, 0))
    assert TRUE_MS + int(time.now_s * 1000) - 4 <= clock.now_ms() <= TRUE_MS + time.now_s * 1000


def test_the_estimate_runs_on_with_the_leaders_monotonic_clock() -> None:
    time, _, clock = three(5_000, (0, 0), round_trip_ms=0)
    time.now_s += 0.3
    assert clock.now_ms() == TRUE_MS + int(time.now_s * 1000)


def test_without_a_fresh_majority_nothing_is_agreed_and_the_time_never_runs_ahead() -> None:
    time, port, clock = three(5_000, (0, 0))
    time.now_s += 0.6  # both answers older than max_age_ms
    assert not clock.agreed()
    assert clock.now_ms() <= TRUE_MS + int(time.now_s * 1000)  # the lowest bound known
    port.clocks = {}
    assert not clock.agreed()
    assert clock.now_ms() == time.now_ms()  # no bound but its own


def test_a_follower_and_a_node_alone_read_their_own_clock() -> None:
    time, port, clock = three(5_000, (0, 0))
    port.leading = False
    assert clock.now_ms() == time.now_ms()
    assert clock.observe() == {}
    alone = ClusterClock("me", time, Port(), 1, max_age_ms=500)
    assert alone.agreed() and alone.now_ms() == time.now_ms()


def test_observe_gives_every_members_offset_and_logs_an_odd_leader_once(
        caplog: pytest.LogCaptureFixture) -> None:
    _, _, clock = three(5_000, (0, 250))
    with caplog.at_level(logging.WARNING, "tickwheel.replication"):
        offsets = clock.observe()
        clock.observe()
    assert offsets["me"].offset_ms == 0
    assert -5_004 <= offsets["p0"].offset_ms <= -5_000 and offsets["p0"].error_ms == 4
    assert -4_754 <= offsets["p1"].offset_ms <= -4_750
    assert caplog.text.count("event=clock_outlier offset_ms=") == 1


def test_an_answer_carries_the_followers_clock_and_bounds_it_by_its_round_trip() -> None:
    now = [10.0]
    follower = PeerClocks(lambda: 42_000, clock_s=lambda: now[0])
    answer = {"type": "next_node_idx", "next_node_idx": 3, ECHO: 9.99}
    follower.outgoing(answer)
    follower.outgoing(heartbeat := {"type": "append_entries"})
    assert answer[WALL] == 42_000 and WALL not in heartbeat
    leader = PeerClocks(lambda: 0, clock_s=lambda: now[0])
    leader.incoming("p0", answer)
    assert WALL not in answer and answer[ECHO] == 9.99  # the lease still reads its echo
    estimate = leader.estimates["p0"]
    assert estimate.base_ms == 42_000 - 10_000
    assert estimate.error_ms == pytest.approx(10)
    assert estimate.heard_s == 10.0


@pytest.mark.parametrize("wall", ["42", 4.2, True, -1, 1 << 60])
def test_a_malformed_clock_stamp_is_dropped_and_logged(
        wall: object, caplog: pytest.LogCaptureFixture) -> None:
    leader = PeerClocks(lambda: 0, clock_s=lambda: 10.0)
    with caplog.at_level(logging.WARNING, "tickwheel.replication"):
        leader.incoming("p0", {"type": "next_node_idx", WALL: wall, ECHO: 9.0})
    assert leader.estimates == {}
    assert "event=raft_message_malformed" in caplog.text


def test_an_answer_without_a_send_time_gives_no_estimate() -> None:
    leader = PeerClocks(lambda: 0, clock_s=lambda: 10.0)
    leader.incoming("p0", {"type": "next_node_idx", WALL: 42_000})
    leader.incoming("p0", {"type": "next_node_idx", WALL: 42_000, ECHO: 0.0})
    assert leader.estimates == {}
