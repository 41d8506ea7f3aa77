"""The console as an ASGI app: its routes and the security headers of every answer.

The rule it keeps, with `tickwheel.console.context`'s checks: no request changes anything
unless it is a POST from a logged-in session carrying that session's CSRF token (and, when the
browser names its origin, from this origin); no page is served without a session. Answers
carry a Content-Security-Policy that allows this origin's one script and style sheet alone,
and are never cached. `build_app` assembles it for `tickwheel.console.serve`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tickwheel.console import actions, live, messages, pages
from tickwheel.console.context import HERE, Console

SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
     b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),  # no-referrer would make the forms' Origin "null"
    (b"cache-control", b"no-store"),
    (b"strict-transport-security", b"max-age=31536000"),
    (b"x-frame-options", b"DENY"),
]


def build_app(console: Console) -> ASGIApp:
    """The app: pages (`tickwheel.console.pages`), changes (`tickwheel.console.actions`),
    live fragments (`tickwheel.console.live`), the static files, behind the headers."""
    routes = [*pages.routes(console), *actions.routes(console), *live.routes(console),
              *messages.routes(console),
              Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        console.sessions.close_all()
    return SecurityHeaders(Starlette(routes=routes, lifespan=lifespan))


class SecurityHeaders:
    """Adds `SECURITY_HEADERS` to every answer (a plain ASGI middleware: it leaves streamed
    answers, the live fragments, streaming)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)
        await self.app(scope, receive, with_headers)
