"""One message's life, and the dead letters: the pages that read messages themselves.

``/message?id=`` (or ``?handle=``): the message's life from every node's ledger
(`LedgerClient.trace`, or `LedgerClient.trace_handle` on the handle's shard, each
node closing its open segment first so that the last rows are searched), and the state its
last committed event leaves it in; the ledger calls take an admin grant on every topic, so
another principal gets the cluster's refusal. ``/dead-letters?topic=%DLQ%...``: up to
`BROWSE_MSGS` dead letters, received as the consumer `CONSUMER` of the topic's default group
and so leased to the console for `LEASE_MS` (then they come back, one attempt more, as the
dead-letter topic retries them); bodies only of topics the principal may consume, since the
cluster refuses the receive otherwise. A resend schedules a copy, due now, to the topic the
operator names (the dead-letter topic's own topic for a default group's), under a new id
(``<id>.resent-<8 hex>``: the old one may still be in the dedupe window) with the property
`RESENT_FROM`, then acknowledges the dead letter: a copy is sent only while the console's
lease is current (renewed first), and a failure between the copy and the ack resends it
again rather than lose it. Called through `tickwheel.console.app`.
"""

from __future__ import annotations

import secrets
from typing import Any, Final

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from tickwheel.client import Client, Received, TickwheelClientError, Trace
from tickwheel.console.context import Console
from tickwheel.console.sessions import Session

DLQ_PREFIX: Final = "%DLQ%"
CONSUMER: Final = "tickwheel-console"
BROWSE_MSGS: Final = 20
LEASE_MS: Final = 120_000
"""How long dead letters browsed stay leased to the console, for a resend."""
RESENT_FROM: Final = "tickwheel-resent-from"
"""The property a resent copy carries: the dead-letter topic it came from."""
STATES: Final = {"scheduled": "pending", "rescheduled": "pending", "cancelled": "cancelled",
                 "withdrawn": "cancelled for the groups that had not leased it",
                 "leased": "handed out", "sent": "handed out", "acked": "acknowledged",
                 "released": "ready again", "returned": "ready again", "nacked": "nacked",
                 "dead_lettered": "dead-lettered"}
"""What a message's last event leaves it as."""


def _handle(text: str) -> int:
    """A handle typed in: the decimal number ``schedule`` answered (ValueError otherwise)."""
    if not text.isdigit() or len(text) > 19:
        raise ValueError(f"handle: {text[:40]!r} is not a handle (the number Schedule "
                         "answered, up to 19 digits)")
    return int(text)


def routes(console: Console) -> list[Route]:
    async def message(request: Request) -> Response:
        session = console.session(request)
        if session is None:
            return RedirectResponse("/login", status_code=303)
        message_id = request.query_params.get("id", "").strip()
        handle = request.query_params.get("handle", "").strip()
        context: dict[str, Any] = {"id": message_id, "handle": handle, "trace": None,
                                   "error": "", "state": ""}
        try:
            if handle:
                trace = await run_in_threadpool(session.ledger.trace_handle,
                                                _handle(handle), close_open=True)
            elif message_id:
                trace = await run_in_threadpool(session.ledger.trace, message_id,
                                                close_open=True)
            if handle or message_id:
                context.update(trace=trace, state=_state(trace))
        except ValueError as malformed:
            context["error"] = str(malformed)
        except TickwheelClientError as error:
            context["error"] = f"Refused by the cluster: {error.code.name}: {error.details}"
        return _render(console, request, session, "message", context)

    async def dead_letters(request: Request) -> Response:
        session = console.session(request)
        if session is None:
            return RedirectResponse("/login", status_code=303)
        topic = request.query_params.get("topic", "").strip()
        context: dict[str, Any] = {"topic": topic, "letters": [], "error": "", "done": ""}
        if topic:
            context.update(await _browse(session, topic))
        return _render(console, request, session, "dead-letters", context)

    async def resend(request: Request) -> Response:
        session, form = await console.guard(request)
        topic, target = form.get("topic", ""), form.get("target", "").strip()
        receipts = ([form["receipt"]] if form.get("receipt") else list(session.dead_letters))
        letters = [session.dead_letters[r] for r in receipts if r in session.dead_letters]
        context: dict[str, Any] = {"topic": topic, "letters": [], "error": "", "done": ""}
        if not target or not letters:
            context["error"] = "Nothing to resend: name a topic, and browse the letters again."
        else:
            try:
                sent = await run_in_threadpool(_resend, session.client, letters, target)
                for letter in letters:
                    session.dead_letters.pop(letter.receipt, None)
                context["done"] = f"Resent {sent} to {target}."
            except TickwheelClientError as error:
                context["error"] = f"Refused by the cluster: {error.code.name}: {error.details}"
        context["letters"] = list(session.dead_letters.values())
        return _render(console, request, session, "dead-letters", context,
                       403 if "PERMISSION_DENIED" in context["error"] else 200)

    return [Route("/message", message), Route("/dead-letters", dead_letters),
            Route("/dead-letters/resend", resend, methods=["POST"])]


def _state(trace: Trace) -> str:
    committed = [e for e in trace.events if e.event in STATES]
    if not committed:
        return "unknown to every ledger that answered"
    return STATES[committed[-1].event]


async def _browse(session: Session, topic: str) -> dict[str, Any]:
    if not topic.startswith(DLQ_PREFIX):
        return {"error": f"{topic!r} is not a dead-letter topic ({DLQ_PREFIX}...)"}
    try:
        received: list[Received] = await run_in_threadpool(_receive, session.client, topic)
    except TickwheelClientError as error:
        return {"error": f"Refused by the cluster: {error.code.name}: {error.details}"}
    session.dead_letters = {**{r: m for r, m in session.dead_letters.items()
                               if m.topic == topic}, **{m.receipt: m for m in received}}
    return {"letters": list(session.dead_letters.values())}


def _receive(client: Client, topic: str) -> list[Received]:
    return client.receive(topic, consumer=CONSUMER, max_messages=BROWSE_MSGS,
                          invisible_duration_ms=LEASE_MS, wait_ms=500)


def _resend(client: Client, letters: list[Received], target: str) -> int:
    """Resend the letters whose lease is still the console's (renewed first, so that it does
    not lapse between the copy and the ack); how many."""
    sent = 0
    for letter in letters:
        if not client.change_invisible_duration(letter.topic, "", [letter.receipt], LEASE_MS)[0]:
            continue  # the lease lapsed: the letter is back in its topic, browse it again
        properties = {**letter.properties, RESENT_FROM: letter.topic}
        client.schedule(target, letter.body, delay_ms=0, properties=properties,
                        id=f"{letter.id}.resent-{secrets.token_hex(4)}")
        client.ack_receipts(letter.topic, "", [letter.receipt])
        sent += 1
    return sent


def _render(console: Console, request: Request, session: Session, view: str,
            context: dict[str, Any], status: int = 200) -> Response:
    return console.templates.TemplateResponse(
        request, f"{view}.html", {**context, "csrf": session.csrf, "view": view,
                                  "default_target": _default_target(context.get("topic", ""))},
        status_code=status)


def _default_target(topic: str) -> str:
    """The topic a default group's dead letters came from (``%DLQ%orders``: orders)."""
    return topic[len(DLQ_PREFIX):] if topic.startswith(DLQ_PREFIX) else ""
