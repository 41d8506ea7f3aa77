"""Who is logged in to the console: its sessions, each with the principal's own client and
a CSRF token.

The rule it keeps: nothing but a random 256-bit session id ever leaves the server, in a cookie
that is ``HttpOnly`` (no script reads it), ``Secure`` (TLS only) and ``SameSite=Strict`` (no
other site's page sends it), named ``__Host-`` so that it is bound to this origin and path
``/``. The principal's token stays in this process, inside the session's clients; every
change a page asks for carries the session's CSRF token in its form, compared in constant
time. A session ends at logout, after ``idle_s`` without a request, or when ``max_sessions``
newer ones push it out (its client is closed then). `tickwheel.console.app` calls it.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from starlette.responses import Response

from tickwheel.client import Client, LedgerClient, Received
from tickwheel.console.views import DeliveryRates, LeaderTimeline

SESSION_COOKIE = "__Host-tickwheel-session"
LOGIN_COOKIE = "__Host-tickwheel-login"
"""Before a session exists: the login form's CSRF token, echoed by the form (double submit)."""


def set_cookie(response: Response, name: str, value: str | None) -> None:
    """Set (or with None, delete) cookie ``name``: HttpOnly, Secure, SameSite=Strict, path /."""
    if value is None:
        response.delete_cookie(name, path="/", secure=True, httponly=True, samesite="strict")
    else:
        response.set_cookie(name, value, path="/", secure=True, httponly=True,
                            samesite="strict")


@dataclass
class Session:
    """One operator logged in: clients acting as their principal, and their CSRF token."""

    client: Client
    ledger: LedgerClient
    """Every node's ledger, for a message's life (`LedgerClient.trace`)."""
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    timeline: LeaderTimeline = field(default_factory=LeaderTimeline)
    """The leader changes this session's pages have seen."""
    rates: DeliveryRates = field(default_factory=DeliveryRates)
    """The topics' deliveries a second, between this session's reads of the cluster."""
    members: set[str] = field(default_factory=set)
    """The members' gRPC addresses learnt from their answers."""
    dead_letters: dict[str, Received] = field(default_factory=dict)
    """The dead letters last browsed, leased to the console, by receipt: what a resend sends."""
    seen_s: float = 0.0

    def csrf_matches(self, offered: str | None) -> bool:
        return offered is not None and hmac.compare_digest(offered.encode(), self.csrf.encode())

    def close(self) -> None:
        self.client.close()
        self.ledger.close()


class Sessions:
    """The open sessions by id, least recently used first. Any thread."""

    def __init__(self, idle_s: float = 3_600.0, max_sessions: int = 256,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._idle_s = idle_s
        self._max_sessions = max_sessions
        self._clock = clock
        self._open: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, client: Client, ledger: LedgerClient) -> tuple[str, Session]:
        """A new session for these clients; its id goes into the cookie."""
        session_id = secrets.token_urlsafe(32)
        session = Session(client, ledger, seen_s=self._clock())
        with self._lock:
            self._open[session_id] = session
            while len(self._open) > self._max_sessions:
                self._open.popitem(last=False)[1].close()
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of ``session_id``, touched; None if there is none (or it idled out)."""
        if not session_id:
            return None
        now_s = self._clock()
        with self._lock:
            session = self._open.get(session_id)
            if session is None:
                return None
            if now_s - session.seen_s > self._idle_s:
                del self._open[session_id]
                session.close()
                return None
            session.seen_s = now_s
            self._open.move_to_end(session_id)
            return session

    def close(self, session_id: str | None) -> None:
        with self._lock:
            session = self._open.pop(session_id or "", None)
        if session is not None:
            session.close()

    def close_all(self) -> None:
        with self._lock:
            sessions, self._open = list(self._open.values()), OrderedDict()
        for session in sessions:
            session.close()
