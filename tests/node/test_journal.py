"""The delivery journal is formatted by hand for speed; every line must still be the JSON the
audit expects, whatever the id holds."""

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tickwheel.node.journal import DeliveryJournal
from tickwheel.node.sent import Sent
from tickwheel.replication.commands import LeaseRef
from tickwheel.replication.dispatcher import Delivery
from tickwheel.wheel import Cursor
from tickwheel.wheel.types import DueMessage


@given(ids=st.lists(st.text(max_size=40), min_size=1, max_size=5),
       duplicate=st.booleans(), attempt=st.integers(1, 1_000),
       group=st.from_regex(r"[A-Za-z0-9._-]{0,12}", fullmatch=True))
def test_delivered_lines_are_the_json_of_each_event(tmp_path_factory, ids: list[str],
                                                    duplicate: bool, attempt: int,
                                                    group: str) -> None:
    path: Path = tmp_path_factory.mktemp("journal") / "deliveries.jsonl"
    journal = DeliveryJournal(path, 'node "a"')
    messages = [DueMessage(id_, "orders.eu-1", b"x", {}, 1_700_000_000_000 + i, 40 + i,
                           1_700_000_000 + i, i) for i, id_ in enumerate(ids)]
    journal.delivered([Sent(Delivery(m, 9, LeaseRef(1, m.handle, 2, 77), duplicate, 3),
                            "receipt", attempt, 1_700_000_000_123, {}) for m in messages],
                      group, 7, 1_700_000_000_123)
    journal.dispatch_started(8, 4, Cursor(1_700_000_001, 2), 1_700_000_001_000)
    journal.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[:-1] == [{
        "event": "delivered", "node": 'node "a"', "term": 7, "group": group, "epoch": 3,
        "id": m.id, "lease": 2,
        "topic": "orders.eu-1", "handle": m.handle, "deliver_at_ms": m.deliver_at_ms,
        "delivered_at_ms": 1_700_000_000_123, "position": [m.slot_second, m.local_index],
        "possible_duplicate": duplicate, "attempt": attempt} for m in messages]
    assert lines[-1]["event"] == "dispatch_started"
