"""Sessions and the leader timeline, in process: a session idles out, the oldest is pushed
out past the limit (its client closed), the CSRF check, the leader changes kept."""

from __future__ import annotations

from typing import Any

from tickwheel.console.sessions import Sessions
from tickwheel.console.views import TIMELINE_LENGTH, LeaderTimeline


class _Client:
    closed = False

    def close(self) -> None:
        self.closed = True


def _open(sessions: Sessions) -> tuple[str, Any]:
    client: Any = _Client()
    session_id, _ = sessions.open(client, _Client())  # type: ignore[arg-type]
    return session_id, client


def test_a_session_ends_after_its_idle_time_and_closes_its_client() -> None:
    now = [0.0]
    sessions = Sessions(idle_s=10.0, clock=lambda: now[0])
    session_id, client = _open(sessions)
    now[0] = 9.0
    assert sessions.get(session_id) is not None  # touched: idles from 9 s on
    now[0] = 18.5
    assert sessions.get(session_id) is not None
    now[0] = 29.0
    assert sessions.get(session_id) is None and client.closed


def test_the_oldest_session_is_pushed_out_past_the_limit() -> None:
    sessions = Sessions(max_sessions=2)
    first, first_client = _open(sessions)
    second, _ = _open(sessions)
    third, _ = _open(sessions)
    assert sessions.get(first) is None and first_client.closed
    assert sessions.get(second) is not None and sessions.get(third) is not None


def test_the_csrf_token_must_match() -> None:
    sessions = Sessions()
    session_id, _ = _open(sessions)
    session = sessions.get(session_id)
    assert session is not None
    assert session.csrf_matches(session.csrf)
    assert not session.csrf_matches(None) and not session.csrf_matches(session.csrf[:-1])
    assert sessions.get("not-a-session") is None and sessions.get(None) is None


def test_the_timeline_keeps_each_change_of_leader_once() -> None:
    timeline = LeaderTimeline()
    timeline.observe("", 0, 1)  # no leader before any: nothing to say
    for at_ms, (leader, term) in enumerate([("a", 1), ("a", 1), ("", 1), ("b", 2), ("b", 2)]):
        timeline.observe(leader, term, at_ms)
    assert [(c.leader, c.term) for c in timeline.changes] == [("b", 2), ("", 1), ("a", 1)]
    for term in range(3, 3 + TIMELINE_LENGTH):
        timeline.observe("c", term, term)
    assert len(timeline.changes) == TIMELINE_LENGTH
