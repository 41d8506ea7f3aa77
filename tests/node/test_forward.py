"""A follower ends the consumer streams it passes to a leader it no longer follows."""

from __future__ import annotations

from typing import Any

from tickwheel.client.credentials import Credentials
from tickwheel.node.api.forward import Forwarder


class Call:
    cancelled = 0

    def cancel(self) -> bool:
        self.cancelled += 1
        return True


def test_streams_passed_to_a_former_leader_are_cancelled_once() -> None:
    forwarder = Forwarder(Credentials(insecure=True))
    to_a, to_b = Call(), Call()
    stream: Any
    with forwarder.passing("a", to_a) as a, forwarder.passing("b", to_b) as b:  # type: ignore[arg-type]
        forwarder.leader_moved("a")  # a leads: the stream to b ends, the one to a stays
        assert (to_a.cancelled, to_b.cancelled) == (0, 1) and b.moved and not a.moved
        forwarder.leader_moved(None)  # an election: a's leadership is over too
        forwarder.leader_moved("c")
        assert (to_a.cancelled, to_b.cancelled) == (1, 1) and a.moved
    with forwarder.passing("c", (stream := Call())):  # type: ignore[arg-type]
        forwarder.leader_moved("c")
    forwarder.leader_moved("d")  # a stream that ended is forgotten
    assert stream.cancelled == 0
