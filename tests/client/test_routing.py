"""The client's routing: a node whose call failed is passed over for a while."""

from __future__ import annotations

from tickwheel.client.routing import FAILED_COOLDOWN_S, LEADER_KEY, Router, answered


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


def test_a_node_that_answered_a_refusal_is_not_passed_over() -> None:
    # A follower whose election runs answers "no leader yet" (UNAVAILABLE, with the leader
    # trailer empty): it is alive, and may name the leader a moment later. Passing it over
    # left a consumer only the paused leader to try while the others cooled.
    now = [100.0]
    router = Router(["a", "b", "c"], clock_s=lambda: now[0])
    router.observe([(LEADER_KEY, "a")])
    router.failed("a")  # no answer: paused
    trailers = [(LEADER_KEY, "")]
    assert answered(trailers) and not answered([]) and not answered(None)
    for _ in range(6):
        chosen = router.choose()
        assert chosen != "a"
        router.failed(chosen, trailers)
