"""Live fragments by server-sent events: ``GET /live/<view>`` streams the page's changing
part, rendered again every `INTERVAL_S`, as ``update`` events that the page's script
(``static/console.js``) puts in place. A failover shows within a poll and the member calls'
timeout (the client's attempt timeout, 1 s). The stream ends when the browser goes away or
the session ends. Called through `tickwheel.console.app`'s routes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tickwheel.console.context import Console
from tickwheel.console.pages import LIVE_VIEWS, fragment, view_params

INTERVAL_S = 0.5


def routes(console: Console) -> list[Route]:
    async def stream(request: Request) -> Response:
        view = request.path_params["view"]
        if view not in LIVE_VIEWS:
            return Response("no such view", status_code=404)
        if console.session(request) is None:
            return Response("not logged in", status_code=403)
        params = view_params(view, request)
        template = console.templates.get_template(f"_{view}.html")

        async def events() -> AsyncIterator[str]:
            while not await request.is_disconnected():
                session = console.session(request)
                if session is None:
                    yield "event: ended\ndata: logged out\n\n"
                    return
                context = await run_in_threadpool(fragment, console, session, view, params)
                html = template.render({**context, "csrf": session.csrf})
                data = "".join(f"data: {line}\n" for line in html.splitlines())
                yield f"event: update\n{data}\n"
                await asyncio.sleep(INTERVAL_S)
        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"x-accel-buffering": "no"})

    return [Route("/live/{view}", stream)]
