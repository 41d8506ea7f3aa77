"""The admin page: schedule, cancel and reschedule messages from forms, as the logged-in
principal. Every form is a POST guarded by `Console.guard` (session and CSRF token); the
cluster authorizes the call with the principal's own token, so a principal without the grant
gets the cluster's refusal (``PERMISSION_DENIED``) and nothing changes. Called through
`tickwheel.console.app`'s routes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from tickwheel.client import Client, PermissionDenied, TickwheelClientError
from tickwheel.console.context import Console

MAX_BODY_CHARS = 65_536
"""What the schedule form takes as a body (the node's own limit is higher)."""


def routes(console: Console) -> list[Route]:
    async def admin(request: Request) -> Response:
        session = console.session(request)
        if session is None:
            return RedirectResponse("/login", status_code=303)
        return _page(console, request, session.csrf, "", "")

    def action(run: Callable[[Client, dict[str, str]], str]) -> Any:
        async def handle(request: Request) -> Response:
            session, form = await console.guard(request)
            try:
                done = await run_in_threadpool(run, session.client, form)
            except (ValueError, KeyError) as wrong:
                return _page(console, request, session.csrf, "", f"Not done: {wrong}.", 400)
            except TickwheelClientError as error:
                status = 403 if isinstance(error, PermissionDenied) else 502
                return _page(console, request, session.csrf, "",
                             f"Refused by the cluster: {error.code.name}: {error.details}",
                             status)
            return _page(console, request, session.csrf, done, "")
        return handle

    return [Route("/admin", admin),
            Route("/admin/schedule", action(_schedule), methods=["POST"]),
            Route("/admin/cancel", action(_cancel), methods=["POST"]),
            Route("/admin/reschedule", action(_reschedule), methods=["POST"])]


def _schedule(client: Client, form: dict[str, str]) -> str:
    body = form.get("body", "")
    if len(body) > MAX_BODY_CHARS:
        raise ValueError(f"the body is over {MAX_BODY_CHARS} characters")
    scheduled = client.schedule(form["topic"].strip(), body,
                                delay_ms=_whole(form, "delay_s", 0) * 1_000,
                                id=form.get("id", "").strip() or None)
    return (f"Scheduled {scheduled.id}: handle {scheduled.handle}, due at "
            f"{scheduled.deliver_at_ms}{' (a duplicate id)' if scheduled.duplicate else ''}.")


def _cancel(client: Client, form: dict[str, str]) -> str:
    outcome = client.cancel_outcomes([_whole(form, "handle")])[0]
    return f"Cancel: {outcome.name}."


def _reschedule(client: Client, form: dict[str, str]) -> str:
    moved = client.reschedule([_whole(form, "handle")],
                              delay_ms=_whole(form, "delay_s", 0) * 1_000)[0]
    return f"Reschedule: {moved.outcome.name}, due at {moved.deliver_at_ms}."


def _whole(form: dict[str, str], name: str, least: int | None = None) -> int:
    text = form.get(name, "").strip()
    if not text.lstrip("-").isdigit():
        raise ValueError(f"{name} is not a whole number")
    value = int(text)
    if least is not None and value < least:
        raise ValueError(f"{name} is below {least}")
    return value


def _page(console: Console, request: Request, csrf: str, done: str, error: str,
          status: int = 200) -> Response:
    return console.templates.TemplateResponse(
        request, "admin.html", {"csrf": csrf, "view": "admin", "done": done, "error": error},
        status_code=status)
