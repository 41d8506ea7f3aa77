"""Handles cannot be guessed (issue 16): on the first release a handle was ``hour << 32 |
sequence``, and a blind Cancel of a seen handle's neighbours hit 5 of 5. A real 3-node
cluster, attacked with the neighbours of a handle the attacker was given."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tickwheel.client import CancelOutcome, InvalidArgument, Message
from tickwheel.harness.local_cluster import LocalCluster

pytestmark = pytest.mark.cluster


def test_neighbours_of_a_known_handle_cancel_nothing_and_handles_outlive_a_full_stop(
        tmp_path: Path) -> None:
    topic = f"h-{uuid.uuid4().hex[:12]}"
    with LocalCluster(tmp_path) as cluster:
        cluster.leader()
        with cluster.client(timeout_s=30) as client:
            victims = client.schedule_many([Message(topic, b"v", delay_ms=60_000, id=f"v{i}")
                                            for i in range(20)])
            (mine,) = client.schedule_many([Message(topic, b"a", delay_ms=60_000, id="a")])
            answers = []
            for guess in [mine.handle + d for d in range(-40, 41) if d] + [
                    v.handle ^ 1 for v in victims]:
                try:
                    answers.append(client.cancel_outcomes([guess])[0])
                except InvalidArgument as error:  # a handle never issued
                    assert error.field == "handles[0]", error
                    answers.append(None)
            assert CancelOutcome.CANCELLED not in answers, answers
            pending = sum(t.pending for t in client.cluster_info().pending if t.topic == topic)
            assert pending == 21
        cluster.stop_all()
        for node in cluster.nodes:
            cluster.start(node)
        cluster.leader(30)
        with cluster.client(timeout_s=30) as client:
            # the handles a client kept still name its messages after a full stop
            assert client.cancel_outcomes([victims[0].handle, mine.handle]) == [
                CancelOutcome.CANCELLED, CancelOutcome.CANCELLED]
            with pytest.raises(InvalidArgument) as refused:
                client.cancel_outcomes([-5])
            assert refused.value.field == "handles[0]"
