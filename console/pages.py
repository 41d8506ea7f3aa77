"""The console's pages: logging in and out, the cluster, topics and groups, the due-time
histogram. Each page is rendered whole once, with the fragment `tickwheel.console.live` then
keeps current (`fragment`, shared by both). Login checks the token by asking the cluster
with it (`Client.cluster_info`): a token the cluster refuses opens no session. Called through
`tickwheel.console.app`'s routes.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Any
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from tickwheel.client import SPANS, TickwheelClientError, Unauthenticated
from tickwheel.console.context import Console
from tickwheel.console.sessions import LOGIN_COOKIE, SESSION_COOKIE, Session, set_cookie
from tickwheel.console.views import read_cluster, read_histogram

LIVE_VIEWS = ("cluster", "topics", "histogram")
"""The pages whose fragment is kept current."""


def routes(console: Console) -> list[Route]:
    async def home(request: Request) -> Response:
        return RedirectResponse("/cluster", status_code=303)

    async def login_form(request: Request) -> Response:
        return _login_page(console, request, "")

    async def login(request: Request) -> Response:
        form = await request.form()
        offered, expected = str(form.get("csrf", "")), request.cookies.get(LOGIN_COOKIE, "")
        if not expected or not hmac.compare_digest(offered.encode(), expected.encode()):
            return _login_page(console, request, "The form expired: log in again.", 403)
        token = str(form.get("token", "")).strip()
        client = console.client_for(token) if token else None
        if client is None:
            return _login_page(console, request, "Give a token.", 401)
        try:
            await run_in_threadpool(client.cluster_info)
        except TickwheelClientError as error:
            client.close()
            refusal = ("The cluster refused this token." if isinstance(error, Unauthenticated)
                       else f"The cluster did not answer: {error.code.name}.")
            return _login_page(console, request, refusal, 401)
        session_id, _ = console.sessions.open(client, console.ledger_for(token))
        response = RedirectResponse("/cluster", status_code=303)
        set_cookie(response, SESSION_COOKIE, session_id)
        set_cookie(response, LOGIN_COOKIE, None)
        return response

    async def logout(request: Request) -> Response:
        await console.guard(request)
        console.sessions.close(request.cookies.get(SESSION_COOKIE))
        response = RedirectResponse("/login", status_code=303)
        set_cookie(response, SESSION_COOKIE, None)
        return response

    def page(view: str) -> Any:
        async def show(request: Request) -> Response:
            session = console.session(request)
            if session is None:
                return RedirectResponse("/login", status_code=303)
            params = view_params(view, request)
            context = await run_in_threadpool(fragment, console, session, view, params)
            return console.templates.TemplateResponse(
                request, f"{view}.html", {**context, "csrf": session.csrf, "view": view,
                                          "live": f"/live/{view}{_query(params)}"})
        return show

    return [Route("/", home), Route("/login", login_form), Route("/login", login, methods=["POST"]),
            Route("/logout", logout, methods=["POST"]),
            *[Route(f"/{view}", page(view)) for view in LIVE_VIEWS]]


def fragment(console: Console, session: Session, view: str, params: dict[str, str]
             ) -> dict[str, Any]:
    """What the template of ``view``'s live part needs, read now (a worker thread)."""
    try:
        if view == "histogram":
            return {"histogram": read_histogram(session.client, params["span"],
                                                params.get("topic", "")),
                    "span": params["span"], "spans": list(SPANS),
                    "topic": params.get("topic", "")}
        cluster, members = read_cluster(session.client, console.seeds + tuple(session.members),
                                        session.timeline, session.rates)
        session.members |= members
        return {"cluster": cluster, "error": ""}
    except TickwheelClientError as error:
        return {"error": f"{error.code.name}: {error.details}", "cluster": None,
                "histogram": None, "span": params.get("span", ""), "spans": list(SPANS),
                "topic": params.get("topic", "")}


def view_params(view: str, request: Request) -> dict[str, str]:
    if view != "histogram":
        return {}
    span = request.query_params.get("span", "minute")
    params = {"span": span if span in SPANS else "minute"}
    topic = request.query_params.get("topic", "").strip()
    if topic:  # the cluster checks it (INVALID_ARGUMENT, PERMISSION_DENIED)
        params["topic"] = topic
    return params


def _query(params: dict[str, str]) -> str:
    return f"?{urlencode(params)}" if params else ""


def _login_page(console: Console, request: Request, error: str, status: int = 200) -> Response:
    csrf = secrets.token_urlsafe(32)
    response = console.templates.TemplateResponse(
        request, "login.html", {"csrf": csrf, "error": error}, status_code=status)
    set_cookie(response, LOGIN_COOKIE, csrf)
    return response
