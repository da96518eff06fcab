"""Several protocol v1 requests behind one HTTP request (llama-server's list of prompts, OpenAI's `n`):
their events merged as they come, each tagged with its request's index; the first error cancels the
others and ends the whole answer, as does the client leaving."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from edgellama.service import protocol as P
from edgellama.service.http.connection import HttpConnection
from edgellama.service.http.fields import from_protocol_error


async def merged(conn: HttpConnection, reqs: list[P.Completion]) -> AsyncIterator[tuple[int, dict[str, Any]]]:
    """(index, event) of every request's events up to its done, in arrival order."""
    queues: list[asyncio.Queue[dict[str, Any]]] = []
    waiting: dict[asyncio.Future[dict[str, Any]], int] = {}
    try:
        for r in reqs:
            queues.append(conn.submit(r))  # a refusal (busy) raises here; the ones queued are cancelled below
        waiting = {asyncio.ensure_future(q.get()): i for i, q in enumerate(queues)}
        while waiting:
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                i = waiting.pop(fut)
                ev = fut.result()
                if ev["event"] == "error":
                    raise from_protocol_error(ev["code"], ev["message"])
                yield i, ev
                if ev["event"] != "done":
                    waiting[asyncio.ensure_future(queues[i].get())] = i
    finally:
        for fut in waiting:
            fut.cancel()
        for r in reqs[:len(queues)]:
            conn.service.cancel(conn, r.id)  # no-op for the ones that ended


async def done_events(conn: HttpConnection, reqs: list[P.Completion]) -> list[dict[str, Any]]:
    """Each request's done event, in the requests' order."""
    out: list[dict[str, Any] | None] = [None] * len(reqs)
    async for i, ev in merged(conn, reqs):
        if ev["event"] == "done":
            out[i] = ev
    return [ev for ev in out if ev is not None]
