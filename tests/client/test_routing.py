"""The client's routing: a node whose call failed is passed over for a while."""

from __future__ import annotations

from tickwheel.client.routing import FAILED_COOLDOWN_S, LEADER_KEY, Router


def test_a_failed_leader_is_passed_over_and_not_taken_back_from_a_hint_until_it_cools() -> None:
    now = [100.0]
    router = Router(["a", "b", "c"], clock_s=lambda: now[0])
    router.observe([(LEADER_KEY, "a")])
    assert router.choose() == "a"
    router.failed("a")  # its stream broke: a paused leader
    assert router.choose() in ("b", "c")
    router.observe([(LEADER_KEY, "a")])  # a follower still names it: its election is running
    assert router.leader is None and router.choose() != "a"
    now[0] += FAILED_COOLDOWN_S
    router.observe([(LEADER_KEY, "a")])
    assert router.choose() == "a"


def test_when_every_node_failed_one_is_still_chosen() -> None:
    router = Router(["a", "b"], clock_s=lambda: 5.0)
    router.failed("a")
    router.failed("b")
    assert router.choose() in ("a", "b")
