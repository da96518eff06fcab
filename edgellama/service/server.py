"""`edgellama serve` put together: one asyncio loop for the socket, protocol, limits, metrics and
systemd; the scheduler's engine thread for the model. Events cross with one call_soon_threadsafe.

Shutdown (SIGTERM/SIGINT): stop accepting, let in-flight work finish within --grace, end the rest
with a `shutdown` error, remove the socket we created, exit 0. SIGHUP reopens the log file.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgellama.service import protocol as P
from edgellama.service.api import Client, LoraInfo, ModelFacts, NotReady, Tokenizer
from edgellama.service.http.connection import HttpConnection, Limits
from edgellama.service.http.router import FirstBytes, route
from edgellama.service.logs import ReopenableHandler
from edgellama.service.metrics import Metrics
from edgellama.service.scheduler import EngineConfig, Job, Scheduler
from edgellama.service.serial_config import PortConfig
from edgellama.service.serial_port import SerialPort
from edgellama.service.systemd import Notifier, activated
from edgellama.service.transport import Connection, listening_socket

if TYPE_CHECKING:
    from edgellama.llm import LLM

log = logging.getLogger("edgellama.service")


@dataclass
class ServeOptions:
    socket_path: str | None  # None: no socket unless systemd passes one (serial ports only)
    socket_mode: int = 0o660
    max_line: int = 65536  # a protocol v1 line or an HTTP request body
    grace: float = 0.0
    log_prompts: bool = False
    model: str = ""  # the model file, as /props and /v1/models name it
    http_host: str = "127.0.0.1"
    http_port: int = 0  # 0: no TCP listener (HTTP on the UNIX socket only)
    api_keys: tuple[str, ...] = ()  # checked on TCP only (the UNIX socket's mode is its access control)
    header_timeout: float = 10.0
    serial: list[PortConfig] = field(default_factory=list)
    embedding: bool = False  # --embedding: embeddings requests are served


class Server:
    """The service: implements api.Service, the interface connections and HTTP routes see."""

    def __init__(self, opts: ServeOptions, engine_cfg: EngineConfig, load: Callable[[], Any],
                 log_handler: ReopenableHandler | None = None) -> None:
        self.opts = opts
        self.metrics = Metrics()
        self.notifier = Notifier()
        self.log_handler = log_handler
        self.connections: set[Client] = set()
        self.ports: list[SerialPort] = []
        self.started = time.time()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop_requested: asyncio.Event | None = None
        self.fatal: BaseException | None = None
        self.scheduler = Scheduler(load, engine_cfg, self.metrics, self._ready_threadsafe, self._fatal_threadsafe)
        self.stopping = False
        self._facts: tuple[Any, ModelFacts] | None = None  # (the LLM, its facts), made at the first ask

    # ---- engine thread -> loop ----
    def _ready_threadsafe(self) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._ready)

    def _ready(self) -> None:
        s = self.scheduler
        llm = s.llm
        assert llm is not None  # the engine thread calls on_ready once the model is loaded
        log.info("model loaded", extra={"fields": {"model": str(llm.path), "n_ctx": llm.n_ctx,
                                                   "load_ms": round(llm.load_ms, 1),
                                                   "system_tokens": len(s.system_tokens)}})
        self.notifier.notify(f"READY=1\nSTATUS=ready: {llm.path.name}, n_ctx {llm.n_ctx}, "
                             f"{len(s.system_tokens)} system prompt tokens cached")

    def _fatal_threadsafe(self, exc: BaseException) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._fatal, exc)

    def _fatal(self, exc: BaseException) -> None:
        self.fatal = exc
        self.request_stop()

    def _emitter(self, conn: Client, job: Job) -> Callable[[dict[str, Any]], None]:
        loop = self.loop
        assert loop is not None

        def emit(event: dict[str, Any]) -> None:
            loop.call_soon_threadsafe(self._deliver, conn, job, event)

        return emit

    def _deliver(self, conn: Client, job: Job, event: dict[str, Any]) -> None:
        conn.send(event)
        if event["event"] in ("done", "error"):
            if conn.port_name is not None:
                job.stats["port"] = conn.port_name  # the log says which line a request came from
            if conn.inflight.get(job.req.id) is job:
                del conn.inflight[job.req.id]
            self._log_request(job, event)
            if conn.eof and not conn.inflight:
                conn.close()

    def _log_request(self, job: Job, event: dict[str, Any]) -> None:
        fields: dict[str, Any] = {"id": job.req.id, "slot": job.slot, "outcome": job.stats.get("outcome")}
        for k in ("port", "n_prompt", "n_cached", "n_eval", "n_predicted", "queue_ms", "ttft_ms", "prompt_ms",
                  "gen_ms"):
            if k in job.stats:
                fields[k] = job.stats[k]
        if event["event"] == "error":
            fields["message"] = event["message"]
        if self.opts.log_prompts:
            fields["prompt"] = job.prompt_text or job.req.prompt or job.req.messages
            fields["output"] = "".join(job.output)
        level = logging.WARNING if event["event"] == "error" and event["code"] == P.INTERNAL else logging.INFO
        log.log(level, "request", extra={"fields": fields})

    # ---- connections ----
    def connection_opened(self, conn: Client) -> None:
        self.connections.add(conn)

    def connection_gone(self, conn: Client) -> None:
        self.connections.discard(conn)
        for job in list(conn.inflight.values()):
            self.scheduler.cancel(job, "gone")  # frees the slot at the next decode step
        conn.inflight.clear()

    def handle_line(self, conn: Client, line: bytes) -> None:
        """A protocol v1 line from conn."""
        self.handle_object(conn, line, P.parse_line)

    def handle_request(self, conn: Client, obj: dict[str, Any]) -> None:
        """A protocol v1 request object built by conn itself (the serial text mode): no JSON round trip."""
        self.handle_object(conn, obj, P.parse_object)

    def handle_object(self, conn: Client, raw: Any, parse: Callable[[Any], P.Request]) -> None:
        try:
            req = parse(raw)
        except P.ProtocolError as exc:
            conn.send(P.error_event(exc.req_id, exc.code, str(exc)))
            self.metrics.outcome(exc.code)
            return
        if isinstance(req, P.Control):
            self._control(conn, req)
            return
        if req.id in conn.inflight:
            conn.send(P.error_event(req.id, P.BAD_REQUEST, f"id {req.id!r} is already in flight on this connection"))
            self.metrics.outcome(P.BAD_REQUEST)
            return
        refused = self.submit(conn, req)
        if refused is not None:
            conn.send(P.error_event(req.id, refused.code, str(refused)))

    def submit(self, conn: Client, req: P.Completion | P.Embedding) -> P.ProtocolError | None:
        """Queues req for conn (its events reach conn.send); the refusal (busy, shutdown, embeddings without
        --embedding, generation from an embedding-only model), counted and logged."""
        refused = self._refuse_kind(req)
        if refused is not None:
            self.metrics.outcome(refused.code)
            return refused
        job = Job(req, emit=lambda event: None)
        job.emit = self._emitter(conn, job)  # the emitter needs the job it reports for
        try:
            self.scheduler.submit(job)
        except P.ProtocolError as exc:
            self.metrics.outcome(exc.code)
            log.info("request", extra={"fields": {"id": req.id, "outcome": exc.code}})
            return exc
        conn.inflight[req.id] = job
        return None

    def _refuse_kind(self, req: P.Completion | P.Embedding) -> P.ProtocolError | None:
        if isinstance(req, P.Embedding) and not self.opts.embedding:
            return P.ProtocolError(P.BAD_REQUEST, "this server does not serve embeddings: start it with --embedding",
                                   req.id)
        return None

    def _control(self, conn: Client, req: P.Control) -> None:
        if req.type == "health":
            snap = self.scheduler.snapshot()
            status = "stopping" if self.stopping else snap["status"]
            conn.send({"event": "health", "id": req.id, "status": status, "slots": snap["slots"],
                       "slots_busy": snap["slots_busy"], "queue": snap["queue"], "queue_max": snap["queue_max"],
                       "n_ctx": snap["n_ctx"], "protocol": P.VERSION})
        elif req.type == "metrics":
            conn.send({"event": "metrics", "id": req.id, "text": self.metrics_text()})
        else:  # cancel
            assert req.id is not None
            job = conn.inflight.get(req.id)
            if job is None:
                conn.send(P.error_event(req.id, P.NOT_FOUND, f"no request {req.id!r} in flight on this connection"))
            else:
                self.scheduler.cancel(job, "cancelled")

    def metrics_text(self) -> str:
        snap = self.scheduler.snapshot()
        return self.metrics.render({"requests_processing": snap["slots_busy"], "requests_deferred": snap["queue"],
                                    "kv_cache_tokens": snap["kv_cache_tokens"], "n_ctx": snap["n_ctx"],
                                    "connections": len(self.connections)})

    # ---- what routes ask (api.Service) ----
    @property
    def status(self) -> str:
        return self.scheduler.status

    @property
    def model_path(self) -> str:
        return self.opts.model

    @property
    def max_tokens(self) -> int:
        return self.scheduler.cfg.max_tokens

    def _llm(self) -> LLM:
        llm = self.scheduler.llm
        if llm is None or self.scheduler.status != "ok":
            raise NotReady("the model is loading")
        return llm

    def model_facts(self) -> ModelFacts | None:
        llm = self.scheduler.llm
        if llm is None:
            return None
        if self._facts is None or self._facts[0] is not llm:  # facts of one loaded model do not change
            md = llm.file.metadata
            template = md.get("tokenizer.chat_template")
            self._facts = (llm, ModelFacts(
                n_ctx=llm.n_ctx, n_vocab=llm.n_vocab,
                n_ctx_train=md.get(f"{md.get('general.architecture')}.context_length"),
                n_embd=getattr(llm.desc, "n_embd", None), size=os.path.getsize(llm.path),
                chat_template=template if isinstance(template, str) else ""))
        return self._facts[1]

    def tokenizer(self) -> Tokenizer:
        return self._llm().tokenizer

    def chat_prompt(self, messages: list[dict[str, Any]]) -> str:
        from edgellama.service.scheduler import render_chat

        # the --system-prompt added as the scheduler adds it to a chat request
        return render_chat(self._llm(), messages, self.scheduler.cfg.system_prompt).text

    def snapshot(self) -> dict[str, Any]:
        return self.scheduler.snapshot()

    @property
    def embedding(self) -> bool:
        return self.opts.embedding

    def pooling(self) -> str:
        return str(self._llm().pooling)

    def rerank_prompt(self, query: str, document: str) -> list[int]:
        from edgellama.embedding import rerank_tokens

        return rerank_tokens(self._llm().tokenizer, query, document)

    def slot_requests(self) -> list[P.Completion | None]:
        return [job.req if job is not None and isinstance(job.req, P.Completion) else None
                for job in self.scheduler.slot_jobs()]

    def lora_adapters(self) -> list[LoraInfo]:
        return [LoraInfo(path=str(ad.path), scale=scale, task_name=ad.task_name, prompt_prefix=ad.prompt_prefix)
                for ad, scale in self.scheduler.lora_adapters()]

    def set_lora_defaults(self, lora: list[tuple[int, float]]) -> None:
        self.scheduler.set_lora_defaults(lora)

    # ---- lifecycle ----
    def request_stop(self) -> None:
        if self.stop_requested is not None:
            self.stop_requested.set()

    def reopen_log(self) -> None:
        if self.log_handler is not None:
            self.log_handler.reopen()
        log.info("log reopened (SIGHUP)")

    async def _watchdog(self) -> None:
        """WATCHDOG=1 only while the engine thread shows progress: a hung decode gets us restarted."""
        period = self.notifier.watchdog_usec / 2e6
        limit = self.notifier.watchdog_usec / 1e6
        while True:
            await asyncio.sleep(period)
            # while loading there is no step to watch (TimeoutStartSec= bounds the start instead)
            if self.scheduler.status == "loading" or time.monotonic() - self.scheduler.heartbeat < limit:
                self.notifier.notify("WATCHDOG=1")

    async def run(self) -> int:
        self.loop = asyncio.get_running_loop()
        self.stop_requested = asyncio.Event()
        servers: list[asyncio.Server] = []
        created = False
        if self.opts.socket_path is not None or activated():
            sock, created = listening_socket(self.opts.socket_path or "", self.opts.socket_mode)
            path = self.opts.socket_path if created else str(sock.getsockname() or "(passed by systemd)")
            servers.append(await self.loop.create_unix_server(
                lambda: FirstBytes(lambda: Connection(self, self.opts.max_line), self._http_connection), sock=sock))
            log.info("listening", extra={"fields": {"socket": path, "activated": not created, "pid": os.getpid()}})
        if self.opts.http_port:
            try:
                servers.append(await self.loop.create_server(self._tcp_connection, self.opts.http_host,
                                                             self.opts.http_port))
            except OSError as exc:
                for server in servers:
                    server.close()
                if created and self.opts.socket_path is not None:
                    os.unlink(self.opts.socket_path)
                raise ValueError(f"cannot listen on {self.opts.http_host}:{self.opts.http_port}: "
                                 f"{exc.strerror or exc}") from None
            log.log(logging.INFO if self.opts.api_keys else logging.WARNING,
                    "listening" if self.opts.api_keys else "listening without an API key (--insecure-no-key)",
                    extra={"fields": {"http": f"{self.opts.http_host}:{self.opts.http_port}",
                                      "api_key": bool(self.opts.api_keys)}})
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, self.request_stop)
        self.loop.add_signal_handler(signal.SIGHUP, self.reopen_log)
        for cfg in self.opts.serial:  # each port opens (or keeps retrying) in its own thread
            port = SerialPort(cfg, self, self.loop)
            self.ports.append(port)
            port.start()
        self.notifier.notify("STATUS=loading the model")
        self.scheduler.start()
        wd = asyncio.create_task(self._watchdog()) if self.notifier.watchdog_usec else None
        try:
            await self.stop_requested.wait()
            await self._shutdown(servers)
        finally:
            if wd is not None:
                wd.cancel()
            if created and self.opts.socket_path is not None:
                try:
                    os.unlink(self.opts.socket_path)
                except FileNotFoundError:
                    pass
            self.notifier.close()
        if self.fatal is not None:
            raise self.fatal
        return 0

    def _http_connection(self) -> HttpConnection:
        """An HTTP/1.1 client (on the UNIX socket, or TCP where the API key is checked)."""
        return HttpConnection(self, Limits(self.opts.max_line, self.opts.header_timeout, ()), route)

    def _tcp_connection(self) -> HttpConnection:
        return HttpConnection(self, Limits(self.opts.max_line, self.opts.header_timeout, self.opts.api_keys), route)

    async def _shutdown(self, servers: list[asyncio.Server]) -> None:
        self.stopping = True
        self.notifier.notify("STOPPING=1\nSTATUS=stopping")
        log.info("stopping", extra={"fields": {"grace_s": self.opts.grace}})
        for server in servers:
            server.close()  # stop accepting; open connections go on until their work ends
        if self.opts.grace > 0 and self.fatal is None:
            self.scheduler.refuse_new()
            deadline = time.monotonic() + self.opts.grace
            while not self.scheduler.idle() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        self.scheduler.stop()
        await asyncio.to_thread(self.scheduler.thread.join, 30.0)
        await asyncio.sleep(0)  # deliver the last events queued by the engine thread
        for conn in list(self.connections):
            conn.close()
        await asyncio.gather(*(asyncio.to_thread(port.stop) for port in self.ports))  # flush, then close
        await asyncio.sleep(0.05)  # let the transports flush and close
        log.info("stopped")
