"""`edgellama serve` put together: one asyncio loop for the socket, protocol, limits, metrics and
systemd; each loaded model's engine thread (service/models.py routes, loads and unloads them).
Events cross with one call_soon_threadsafe.

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
from edgellama.service.api import Client, ModelInfo
from edgellama.service.http.connection import HttpConnection, Limits
from edgellama.service.http.router import FirstBytes, route
from edgellama.service.logs import ReopenableHandler
from edgellama.service.metrics import Metrics
from edgellama.service.model_config import ModelsConfig, ModelSpec
from edgellama.service.model_view import Model
from edgellama.service.models import ModelHost, ModelSet, verified_load
from edgellama.service.scheduler import EngineConfig, Job
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
    http_host: str = "127.0.0.1"
    http_port: int = 0  # 0: no TCP listener (HTTP on the UNIX socket only)
    api_keys: tuple[str, ...] = ()  # checked on TCP only (the UNIX socket's mode is its access control)
    header_timeout: float = 10.0
    serial: list[PortConfig] = field(default_factory=list)
    budget: int | None = None  # bytes the models loaded together may take (several models)
    load_wait: float = 600.0  # seconds a route that needs a model's tokenizer waits for it to load


class Server:
    """The service: implements api.Service, the interface connections and HTTP routes see."""

    def __init__(self, opts: ServeOptions, models: ModelsConfig, engine_cfg: EngineConfig,
                 log_handler: ReopenableHandler | None = None,
                 load: Callable[[ModelSpec], LLM] = verified_load) -> None:
        self.opts = opts
        self.metrics = Metrics()  # what is counted before a request reaches a model (refusals, serial ports)
        self.notifier = Notifier()
        self.log_handler = log_handler
        self.connections: set[Client] = set()
        self.ports: list[SerialPort] = []
        self.started = time.time()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop_requested: asyncio.Event | None = None
        self.fatal: BaseException | None = None
        self.interrupted = False  # stopped by SIGINT (Ctrl-C), not SIGTERM
        self.cfg = models
        self.engine_cfg = engine_cfg
        self.models = ModelSet(models, engine_cfg, opts.budget if models.several else None,
                               self._ready_threadsafe, self._failed_threadsafe, load=load)
        if not models.several:  # one model: its counters are the service's, as before several existed
            next(iter(self.models.hosts.values())).metrics = self.metrics
        self.stopping = False
        self.ready_sent = False

    @property
    def several(self) -> bool:
        return self.cfg.several

    # ---- engine threads -> loop ----
    def _ready_threadsafe(self, host: ModelHost) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._ready, host)

    def _ready(self, host: ModelHost) -> None:
        s = host.sched
        llm = s.llm if s is not None else None
        if s is None or llm is None:
            return  # unloaded again already
        Model(host).model_facts()  # kept for /v1/models while it is not loaded
        fields = {"model": str(llm.path), "n_ctx": llm.n_ctx, "load_ms": round(llm.load_ms, 1),
                  "system_tokens": len(s.system_tokens)}
        if self.several:
            fields = {"name": host.name, **fields, "sha256_checked": host.spec.sha256 is not None,
                      "models_memory_mib": round(self.models.held_bytes() / 2**20, 1)}
        log.info("model loaded", extra={"fields": fields})
        self._notify_ready(f"STATUS=ready: {llm.path.name}, n_ctx {llm.n_ctx}, {len(s.system_tokens)} system prompt "
                           "tokens cached" if not self.several else f"STATUS=ready: {host.name} loaded")

    def _notify_ready(self, status: str) -> None:
        self.notifier.notify(("READY=1\n" if not self.ready_sent else "") + status)
        self.ready_sent = True

    def _failed_threadsafe(self, host: ModelHost, exc: BaseException) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._failed, host, exc)

    def _failed(self, host: ModelHost, exc: BaseException) -> None:
        if not self.several:  # one model: the service has nothing to serve, and exits
            self.fatal = exc
            self.request_stop()
        elif not self.ready_sent:
            self._notify_ready(f"STATUS=ready; {host.name} failed: {host.reason}")

    def _emitter(self, conn: Client, job: Job, host: ModelHost) -> Callable[[dict[str, Any]], None]:
        loop = self.loop
        assert loop is not None

        def emit(event: dict[str, Any]) -> None:
            loop.call_soon_threadsafe(self._deliver, conn, job, host, event)

        return emit

    def _deliver(self, conn: Client, job: Job, host: ModelHost, event: dict[str, Any]) -> None:
        if event["event"] == "done":
            event["model"] = host.name
        conn.send(event)
        if event["event"] in ("done", "error"):
            if conn.port_name is not None:
                job.stats["port"] = conn.port_name  # the log says which line a request came from
            if conn.inflight.get(job.req.id) is job:
                del conn.inflight[job.req.id]
            self._log_request(job, host, event)
            if conn.eof and not conn.inflight:
                conn.close()
            self.models.touched(host, job.req.keep_alive)

    def _log_request(self, job: Job, host: ModelHost, event: dict[str, Any]) -> None:
        fields: dict[str, Any] = {"id": job.req.id, "slot": job.slot, "outcome": job.stats.get("outcome")}
        if self.several:
            fields["model"] = host.name
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
            if job.scheduler is not None:
                job.scheduler.cancel(job, "gone")  # frees the slot at the next decode step
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
        """Queues req for conn on its model (its events reach conn.send); the refusal (busy, shutdown, an
        unknown or failed model, embeddings from a model without --embedding), counted and logged."""
        try:
            host, _alias = self.models.resolve(req.model, req_id=req.id)
            refused = self._refuse_kind(host, req)
            if refused is not None:
                raise refused
        except P.ProtocolError as exc:
            self.metrics.outcome(exc.code)
            return exc
        job = Job(req, emit=lambda event: None, model=host.name)
        job.emit = self._emitter(conn, job, host)  # the emitter needs the job it reports for
        try:
            self.models.submit(host, job)
        except P.ProtocolError as exc:
            host.metrics.outcome(exc.code)
            log.info("request", extra={"fields": {"id": req.id, "outcome": exc.code}
                                       | ({"model": host.name} if self.several else {})})
            return exc
        conn.inflight[req.id] = job
        if isinstance(req, P.Completion) and req.schema_notes:  # the documented relaxations, named for it
            log.info("schema read loosely", extra={"fields": {"id": req.id, "notes": req.schema_notes}})
        return None

    def _refuse_kind(self, host: ModelHost, req: P.Completion | P.Embedding) -> P.ProtocolError | None:
        if isinstance(req, P.Embedding) and not host.spec.opts.embedding:
            where = f"model {host.name} is not served with embeddings (its [models.{host.name}] table: embedding = " \
                    "true)" if self.several else "this server does not serve embeddings: start it with --embedding"
            return P.ProtocolError(P.BAD_REQUEST, where, req.id)
        return None

    def _control(self, conn: Client, req: P.Control) -> None:
        if req.type == "health":
            try:
                m = self.model(req.model)
            except P.ProtocolError as exc:
                conn.send(P.error_event(req.id, exc.code, str(exc)))
                return
            snap = m.snapshot()
            status = "stopping" if self.stopping else snap["status"]
            event = {"event": "health", "id": req.id, "status": status, "slots": snap["slots"],
                     "slots_busy": snap["slots_busy"], "queue": snap["queue"], "queue_max": snap["queue_max"],
                     "n_ctx": snap["n_ctx"], "protocol": P.VERSION}
            if self.several:
                event["model"] = m.name
                event["models"] = {i.name: i.state for i in self.models.states()}
            conn.send(event)
        elif req.type == "metrics":
            conn.send({"event": "metrics", "id": req.id, "text": self.metrics_text()})
        else:  # cancel
            assert req.id is not None
            if req.id not in conn.inflight:
                conn.send(P.error_event(req.id, P.NOT_FOUND, f"no request {req.id!r} in flight on this connection"))
            self.cancel(conn, req.id)

    def cancel(self, conn: Client, req_id: str | int) -> None:
        job = conn.inflight.get(req_id)
        if job is not None and job.scheduler is not None:
            job.scheduler.cancel(job, "cancelled")

    def metrics_text(self) -> str:
        per_model = []
        for host in self.models.hosts.values():
            snap = Model(host).snapshot()
            gauges = {"requests_processing": snap["slots_busy"], "requests_deferred": snap["queue"],
                      "kv_cache_tokens": snap["kv_cache_tokens"], "n_ctx": snap["n_ctx"]}
            if not self.several:  # one model: its metrics are the service's (the same object), unlabelled
                return self.metrics.render(gauges | {"connections": len(self.connections)})
            per_model.append((host.name, host.metrics, gauges | {"loaded": int(host.state == "loaded"),
                                                                 "loads": host.loads}))
        return self.metrics.render_models(per_model, len(self.connections), dict(self.models.alias_counts),
                                          self.models.swaps, self.models.held_bytes(), self.models.budget)

    # ---- what routes ask (api.Service) ----
    @property
    def status(self) -> str:
        if self.several:
            return "ok" if self.ready_sent else "loading"
        host = next(iter(self.models.hosts.values()))
        return "ok" if host.state == "loaded" else "loading"

    @property
    def max_tokens(self) -> int:
        return self.engine_cfg.max_tokens

    def model(self, name: str | None) -> Model:
        host, _ = self.models.resolve(name, pick=False)
        return Model(host)

    def choose(self, name: str | None) -> str:
        host, _ = self.models.resolve(name)
        return host.name

    async def loaded(self, name: str | None) -> Model:
        m = self.model(name)
        if not self.several:
            return m
        deadline = time.monotonic() + self.opts.load_wait
        while time.monotonic() < deadline and not self.stopping:
            host = m.host
            if host.state == "loaded":
                return m
            if host.state == "failed" and host.source_identity() == host.failed_identity:
                raise P.ProtocolError(P.UNAVAILABLE, f"model {m.name} is unavailable: {m.reason}")
            if host.state in ("unloaded", "failed") and (host.sched is None or host.sched.stopping):
                self.models.load_now(m.name)  # (again: it may have been unloaded for another meanwhile)
            await asyncio.sleep(0.02)
        return m  # the route answers 503 for a model still not loaded

    def model_list(self) -> list[ModelInfo]:
        return self.models.states()

    def load_model(self, name: str) -> None:
        self.models.load_now(name)

    def unload_model(self, name: str) -> bool:
        return self.models.unload(name)

    # ---- lifecycle ----
    def request_stop(self, sig: int | None = None) -> None:
        if sig == signal.SIGINT:
            self.interrupted = True  # Ctrl-C: the README's exit 130, after the same graceful stop
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
            now = time.monotonic()
            if all(s.status in ("loading", "closed") or now - s.heartbeat < limit for s in self.models.schedulers()):
                self.notifier.notify("WATCHDOG=1")

    async def _reaper(self) -> None:
        """Unloads the models whose keep_alive ran out."""
        while True:
            await asyncio.sleep(0.25)
            self.models.reap()

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
            self.loop.add_signal_handler(sig, self.request_stop, sig)
        self.loop.add_signal_handler(signal.SIGHUP, self.reopen_log)
        for cfg in self.opts.serial:  # each port opens (or keeps retrying) in its own thread
            port = SerialPort(cfg, self, self.loop)
            self.ports.append(port)
            port.start()
        self.notifier.notify("STATUS=loading the model")
        default = self.model(self.cfg.default)
        if default.host.state != "failed":
            self.models.load_now(default.name)  # the default model at once; the others on their first request
        else:
            self._notify_ready(f"STATUS=ready; {default.name} failed: {default.reason}")
        tasks = [asyncio.create_task(self._reaper())]
        if self.notifier.watchdog_usec:
            tasks.append(asyncio.create_task(self._watchdog()))
        try:
            await self.stop_requested.wait()
            await self._shutdown(servers)
        finally:
            for task in tasks:
                task.cancel()
            if created and self.opts.socket_path is not None:
                try:
                    os.unlink(self.opts.socket_path)
                except FileNotFoundError:
                    pass
            self.notifier.close()
        if self.fatal is not None:
            raise self.fatal
        return 128 + signal.SIGINT if self.interrupted else 0  # Ctrl-C: 130, as every command (README)

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
            self.models.refuse_new()
            deadline = time.monotonic() + self.opts.grace
            while not self.models.idle() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        threads = self.models.schedulers()
        self.models.stop()
        for s in threads:
            if s.thread.is_alive():
                await asyncio.to_thread(s.thread.join, 30.0)
        await asyncio.sleep(0)  # deliver the last events queued by the engine thread
        for conn in list(self.connections):
            conn.close()
        await asyncio.gather(*(asyncio.to_thread(port.stop) for port in self.ports))  # flush, then close
        await asyncio.sleep(0.05)  # let the transports flush and close
        log.info("stopped")
