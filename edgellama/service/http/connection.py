"""One HTTP/1.1 client connection driven through h11 (uvicorn's h11_impl is the model): bytes in ->
h11 events -> one task per request running its route; responses out through h11. Keep-alive, chunked
and Content-Length bodies, `Expect: 100-continue`, a body limit, a header timeout against slowloris.

Framing and limits only: what a request means is the routes' business; scheduling is the server's.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import h11

from edgellama.service import protocol as P
from edgellama.service.api import Service
from edgellama.service.http.fields import HttpError, error_body, from_protocol_error
from edgellama.service.transport import peer_closed

log = logging.getLogger("edgellama.service")

MAX_HEADER = 16384  # request line and headers (h11's incomplete-event bound): more is a 431
PUBLIC = {"/health", "/v1/health"}  # answered without the API key, as llama-server does
SERVER_NAME = b"edgellama"
_REQUEST_IDS = itertools.count(1)


@dataclass
class Limits:
    max_body: int = 65536  # --max-line: the largest request, a protocol v1 line or an HTTP body
    header_timeout: float = 10.0  # the request line and headers must be in within this (slowloris)
    api_keys: tuple[str, ...] = ()  # Authorization: Bearer KEY, checked when not empty


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b""


Route = Callable[["HttpConnection", h11.Request, bytes], Awaitable[None]]


class HttpConnection(asyncio.Protocol):
    port_name: str | None = None  # a socket client, not a serial port (api.Client)

    def __init__(self, service: Service, limits: Limits, routes: Callable[[str, str], Route]) -> None:
        self.service = service
        self.limits = limits
        self.routes = routes
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER)
        self.transport: asyncio.Transport | None = None
        self.inflight: dict[str | int, Any] = {}  # request id -> job (the server's bookkeeping)
        self.queues: dict[str | int, asyncio.Queue[dict[str, Any]]] = {}  # request id -> its events
        self.eof = False  # the server closes a client with eof once its last event is sent: never here,
        self.half_closed = False  # as the response is written after that event; this closes it instead
        self.closed = False
        self.framing_close = False  # the request had both Transfer-Encoding and Content-Length: close after it
        self.refused = False  # answered before its request was read whole: nothing more is read
        self.request: h11.Request | None = None
        self.body = bytearray()
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.got_bytes = False  # bytes of the next request arrived (a timeout then gets a 408)

    # ---- asyncio.Protocol ----
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.service.connection_opened(self)
        self._arm_timer()

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        self.h11.receive_data(data)
        if self.task is not None and len(self.h11.trailing_data[0]) > MAX_HEADER + self.limits.max_body:
            assert self.transport is not None  # pipelined bytes beyond one request's worth wait in the kernel
            self.transport.pause_reading()
        self._pump()

    def eof_received(self) -> bool:
        self.half_closed = True
        self.h11.receive_data(b"")
        self._pump()
        # a half-closed client still reads its answer; one that closed outright is gone (connection_lost
        # then cancels its generation)
        return self.task is not None and not self.closed and not peer_closed(self.transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_timer()
        if self.task is not None:
            self.task.cancel()
        self.service.connection_gone(self)

    # ---- the server's side of a client (api.Client) ----
    def send(self, event: dict[str, Any]) -> None:
        q = self.queues.get(event.get("id"))  # type: ignore[arg-type]
        if q is not None:
            q.put_nowait(event)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # ---- reading requests ----
    def _pump(self) -> None:
        while not self.closed and not self.refused and self.task is None:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                self._refuse(exc.error_status_hint, f"bad HTTP request: {exc}")
                return
            if event is h11.NEED_DATA:
                return
            if event is h11.PAUSED:  # a pipelined request waits for this response to end
                assert self.transport is not None
                self.transport.pause_reading()
                return
            if isinstance(event, h11.Request):
                self._cancel_timer()
                self._request(event)
            elif isinstance(event, h11.Data):
                self.body += event.data
                if len(self.body) > self.limits.max_body:
                    self._refuse(413, f"request body larger than {self.limits.max_body} bytes (--max-line)")
                    return
            elif isinstance(event, h11.EndOfMessage):
                self._cancel_timer()
                assert self.request is not None
                self.task = asyncio.get_running_loop().create_task(self._serve(self.request, bytes(self.body)))
            elif isinstance(event, h11.ConnectionClosed):
                self.close()
                return

    def _request(self, req: h11.Request) -> None:
        self.request = req
        self.body = bytearray()
        # h11 bounds a request still arriving; one that came whole in one read is measured here
        size = len(req.method) + len(req.target) + sum(len(k) + len(v) + 4 for k, v in req.headers)
        if size > MAX_HEADER:
            self._refuse(431, f"request line and headers larger than {MAX_HEADER} bytes")
            return
        names = [k for k, _ in req.headers]
        if names.count(b"authorization") > 1:
            self._refuse(400, "two Authorization headers: send one")
            return
        # RFC 9112 6.3: a body framed by Transfer-Encoding despite a Content-Length is read by the former,
        # and the connection closes after the answer (the two may be a request-smuggling attempt)
        self.framing_close = b"transfer-encoding" in names and b"content-length" in names
        length = dict(req.headers).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limits.max_body:
            self._refuse(413, f"request body of {int(length)} bytes is larger than {self.limits.max_body} "
                              "(--max-line)")
            return
        path = req.target.decode("ascii", "replace").split("?", 1)[0]
        if self.limits.api_keys and path not in PUBLIC and not self._authorized(req):
            self._refuse(401, "Invalid API Key")
            return
        if self.h11.they_are_waiting_for_100_continue:
            self._send(h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue"))
        # the body must arrive within the timeout too
        self._arm_timer()

    def _authorized(self, req: h11.Request) -> bool:
        auth = dict(req.headers).get(b"authorization", b"")
        scheme, _, key = auth.decode("latin-1").partition(" ")
        return scheme.lower() == "bearer" and any(hmac.compare_digest(key.strip(), k) for k in self.limits.api_keys)

    # ---- timeouts ----
    def _arm_timer(self) -> None:
        self._cancel_timer()
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.limits.header_timeout, self._timed_out)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _timed_out(self) -> None:
        self.timer = None
        if self.task is not None or self.closed:
            return
        if self.got_bytes:
            self._refuse(408, f"request not complete within {self.limits.header_timeout:g} s")
        else:  # an idle keep-alive connection: just close it
            self.close()

    # ---- writing responses ----
    def _send(self, event: Any) -> None:
        data = self.h11.send(event)
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _refuse(self, status: int, message: str) -> None:
        """An error answer before the request was read whole: sent if h11 still may, then the connection closes
        (the rest of what the client sent is never parsed: a refused request's body never reaches a route)."""
        self.refused = True
        if self.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            try:
                self.respond_json(status, error_body(status, message, HttpError(status, message).type),
                                  close=True)
            except h11.LocalProtocolError:
                pass
        log.info("http refused", extra={"fields": {"status": status, "message": message}})
        self.close()

    def _headers(self, content_type: bytes, extra: Iterable[tuple[bytes, bytes]], close: bool) -> list[Any]:
        close = close or self.framing_close
        h: list[Any] = [(b"content-type", content_type), (b"server", SERVER_NAME), *extra]
        if close:
            h.append((b"connection", b"close"))
        return h

    def respond(self, status: int, body: bytes, content_type: bytes, close: bool = False,
                headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
        h = self._headers(content_type, headers, close)
        h.append((b"content-length", str(len(body)).encode()))
        self._send(h11.Response(status_code=status, headers=h, reason=_reason(status)))
        self._send(h11.Data(data=body))
        self._send(h11.EndOfMessage())

    def respond_json(self, status: int, obj: Any, close: bool = False) -> None:
        body = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        self.respond(status, body, b"application/json; charset=utf-8", close)

    def start_stream(self, content_type: bytes = b"text/event-stream") -> None:
        """A response whose body follows in pieces (chunked on HTTP/1.1), each written at once."""
        self._send(h11.Response(status_code=200, reason=b"OK", headers=self._headers(
            content_type, [(b"cache-control", b"no-cache")], close=False)))

    def write(self, data: bytes) -> None:
        self._send(h11.Data(data=data))

    def end_stream(self) -> None:
        self._send(h11.EndOfMessage())

    @property
    def response_started(self) -> bool:
        return self.h11.our_state is not h11.SEND_RESPONSE

    # ---- generation requests (through the service) ----
    def next_id(self) -> str:
        """The protocol v1 id of this connection's current request, unique in the server's log."""
        return f"http-{next(_REQUEST_IDS)}"

    def submit(self, req: P.Completion | P.Embedding) -> asyncio.Queue[dict[str, Any]]:
        """Queues req like a protocol v1 line would be; its events arrive on the returned queue."""
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.queues[req.id] = q
        refused = self.service.submit(self, req)
        if refused is not None:
            del self.queues[req.id]
            raise from_protocol_error(refused.code, str(refused))
        return q

    async def events(self, req: P.Completion | P.Embedding) -> AsyncIterator[dict[str, Any]]:
        """req's protocol v1 events up to its done; an error event is raised as an HttpError."""
        q = self.submit(req)
        while True:
            ev = await q.get()
            if ev["event"] == "error":
                raise from_protocol_error(ev["code"], ev["message"])
            yield ev
            if ev["event"] == "done":
                return

    # ---- one request ----
    async def _serve(self, req: h11.Request, body: bytes) -> None:
        method = req.method.decode("ascii", "replace")
        path = req.target.decode("ascii", "replace").split("?", 1)[0]
        try:
            await self.routes(method, path)(self, req, body)
        except HttpError as exc:
            if not self.response_started:
                self.respond_json(exc.status, error_body(exc.status, str(exc), exc.type))
            else:  # a stream already under way: the error goes as its last event
                self.write(b"data: " + json.dumps(error_body(exc.status, str(exc), exc.type)).encode() + b"\n\n")
                self.end_stream()
        except asyncio.CancelledError:
            raise  # the connection is gone
        except Exception as exc:  # a bug in a route ends that request, not the server
            log.exception("http request failed", extra={"fields": {"path": path}})
            if not self.response_started:
                self.respond_json(500, error_body(500, f"internal error: {exc}", "server_error"))
            else:
                self.close()
                return
        finally:
            self.queues.clear()
        self._next_cycle()

    def _next_cycle(self) -> None:
        self.task = None
        if self.closed:
            return
        if self.half_closed or h11.MUST_CLOSE in (self.h11.our_state, self.h11.their_state):
            self.close()  # a half-closed client got its answer, or HTTP says this connection ends
            return
        try:
            self.h11.start_next_cycle()
        except h11.LocalProtocolError:  # the client did not finish its side: no keep-alive
            self.close()
            return
        self.request = None
        self.body = bytearray()
        self.got_bytes = bool(self.h11.trailing_data[0])
        assert self.transport is not None
        self.transport.resume_reading()
        self._arm_timer()
        self._pump()  # a pipelined request may be buffered already
