"""What the console's routes share (`Console`): the sessions, how a principal's client is
made, the members to ask first, the templates; and the two checks every request passes: a live
session for every page (`Console.session`), and for every change the session's CSRF token, from
this origin (`Console.guard`). Built by `tickwheel.console.serve`, used by the route modules.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.templating import Jinja2Templates

from tickwheel.client import Client, LedgerClient
from tickwheel.console.sessions import SESSION_COOKIE, Session, Sessions

HERE = Path(__file__).parent


class Console:
    """What the routes share: the sessions, how a principal's client is made, the members
    to ask first, the templates."""

    def __init__(self, sessions: Sessions, client_for: Callable[[str], Client],
                 ledger_for: Callable[[str], LedgerClient], seeds: tuple[str, ...]) -> None:
        self.sessions = sessions
        self.client_for = client_for
        """A client acting with the given token (not yet checked)."""
        self.ledger_for = ledger_for
        self.seeds = seeds
        self.templates = Jinja2Templates(directory=str(HERE / "templates"))

    def session(self, request: Request) -> Session | None:
        return self.sessions.get(request.cookies.get(SESSION_COOKIE))

    async def guard(self, request: Request) -> tuple[Session, dict[str, str]]:
        """The session of a change and its form; 403 without a session, without the session's
        CSRF token, or from another origin."""
        session = self.session(request)
        if session is None:
            raise HTTPException(403, "not logged in")
        origin = request.headers.get("origin")
        if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
            raise HTTPException(403, "cross-origin request refused")
        form = {key: str(value) for key, value in (await request.form()).items()}
        if not session.csrf_matches(form.get("csrf")):
            raise HTTPException(403, "missing or wrong CSRF token")
        return session, form
