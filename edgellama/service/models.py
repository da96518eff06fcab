"""The service's models: each configured model (model_config.ModelSpec) is a ModelHost with a state
(unloaded, loading, loaded, failed) and, while it has one, a Scheduler whose engine thread holds the LLM.
ModelSet routes a request to its model (an alias picks one of its models by weight), loads a model on
its first request, and keeps the models loaded together within the RAM budget and --models-max:

- a load first waits, on the new model's own engine thread, until the memory plans of the loaded models
  plus its own fit; idle models are unloaded for it, least recently used first. A model with a request
  running or queued is never unloaded: the load waits for it to go idle. Memory is counted free only
  once the unloaded model's thread has closed it, so two models that do not fit are never held at once.
- a model's sha256 (if configured) is checked on the mapped bytes on every load, beside the load on
  another core; the model answers nothing until it matches. A mismatch, a bad file or a failing load
  makes the model `failed` with the reason; its requests get an `unavailable` error naming it, the other
  models go on. A failed model is tried again when its file changes, or on POST /models/load.
- before a request is queued, the model's file is compared (digest.identity) with the one mapped: if the
  path now names another file, or the file was written, the mapped model takes no more requests (those
  running finish on it) and the next load reads the new file.
- keep_alive (ollama's): after a request, its model stays loaded for that long (the request's
  `keep_alive`, else the model's, else --keep-alive; < 0 until evicted), then is unloaded when idle.

Lock order: the set's cond, then a scheduler's, never the reverse: an engine thread reports to the set
(ready, failed, closed, and a request's end through the server's loop) holding no scheduler lock.
"""

from __future__ import annotations

import gc
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from edgellama.gguf import digest
from edgellama.load_options import check_model_args, load, model_path
from edgellama.memplan import BASE_OVERHEAD, BudgetError, MemoryPlan, fmt_bytes
from edgellama.service import protocol as P
from edgellama.service.api import ModelInfo
from edgellama.service.job import Job
from edgellama.service.metrics import Metrics
from edgellama.service.model_config import ModelsConfig, ModelSpec
from edgellama.service.scheduler import EngineConfig, Scheduler

if TYPE_CHECKING:
    from edgellama.gguf.split import ModelFile
    from edgellama.llm import LLM

log = logging.getLogger("edgellama.service")

STATES = ("unloaded", "loading", "loaded", "failed")


class VerifyError(ValueError):
    """The model file does not hash to its configured sha256."""


class Withdrawn(Exception):
    """A load given up before it began: the model was unloaded (POST /models/unload) or the service stops."""


class ModelHost:
    """One configured model: its plan, state and (while loaded or loading) its scheduler."""

    def __init__(self, spec: ModelSpec, engine: EngineConfig) -> None:
        self.name = spec.name
        self.spec = spec
        self.engine = engine
        self.plan: MemoryPlan | None = None
        self.plan_identity: tuple[int, ...] = ()  # of the file the plan was made from
        self.state = "unloaded"
        self.reason = ""  # why it failed
        self.failed_identity: tuple[int, ...] = ()  # of the file that failed: another one is tried again
        self.sched: Scheduler | None = None  # the current one; an older one may still drain (ModelSet.live)
        self.identity: tuple[tuple[int, ...], ...] = ()  # of the files the loaded model maps
        self.paths: list[str] = []  # the files of the loaded model (a split model's pieces)
        self.metrics = Metrics()
        self.last_used = 0.0  # time.monotonic() of its last request's end (LRU order)
        self.keep_until: float | None = None  # unload once idle after this (monotonic); None: until evicted
        self.loads = 0
        self.facts: Any = None  # api.ModelFacts of the last load (plain data: no reference to the model)

    def file_changed(self) -> bool:
        """The loaded model's files are no longer what their paths name (renamed over, or written)."""
        return bool(self.paths) and tuple(digest.identity(p) for p in self.paths) != self.identity

    def source_identity(self) -> tuple[int, ...]:
        """The identity of the file the model's flags name now (its first piece); () if there is none."""
        try:
            return digest.identity(model_path(self.spec.opts))
        except (OSError, ValueError):
            return ()


def model_files(f: ModelFile) -> list[tuple[str, Any]]:
    """(path, GGUFFile) of every file the model maps."""
    from edgellama.gguf.split import iter_pieces

    return [(str(p), g) for p, g in iter_pieces(f)]


def plan_of(spec: ModelSpec) -> tuple[MemoryPlan, tuple[int, ...]]:
    """The memory plan loading spec would make (from the header: no weights read), and the identity of
    the file it was made from."""
    from edgellama.gguf.split import open_model_file
    from edgellama.llm import default_threads, load_plan
    from edgellama.wiring import build_desc

    a = spec.opts
    check_model_args(a)
    with open_model_file(model_path(a)) as f:
        hp, desc = build_desc(f)
        loras = []
        if a.lora:
            from edgellama.lora.adapter import read_adapter

            loras = [read_adapter(path, f) for path, _scale in a.lora]
        plan = load_plan(hp, desc, a.ctx_size or None, a.batch_size, a.threads or default_threads(), a.cache_type,
                         None, a.numerics, a.parallel, loras, a.embedding or desc.non_causal)
        return plan, model_files(f)[0][1].identity


def together(plans: list[MemoryPlan]) -> int:
    """Bytes several models take in one process: each plan counts the interpreter's own overhead, once here."""
    return sum(p.total - BASE_OVERHEAD for p in plans) + BASE_OVERHEAD if plans else 0


def verified_load(spec: ModelSpec) -> LLM:
    """The model of spec's settings (load_options.load), from a file checked against spec.sha256: the sha256
    of the mapped bytes (what the engine reads), computed on another thread while the LLM is built;
    VerifyError on a mismatch."""
    from edgellama.gguf.split import SplitGGUF, merged_sha256, open_model_file

    want = spec.sha256
    if want is None:
        return load(spec.opts)
    f = open_model_file(model_path(spec.opts))
    files = model_files(f)
    wanted = [want] if isinstance(want, str) else list(want)
    if isinstance(want, list) and len(want) != len(files):
        f.close()
        raise VerifyError(f"sha256: {len(want)} given for {len(files)} file(s) (one per piece of a split model)")
    stop = threading.Event()
    got: dict[str, Any] = {}

    def hash_files() -> None:
        try:
            if isinstance(want, str) and isinstance(f, SplitGGUF):
                got["sha"] = [merged_sha256(f)]  # a split model's sha256: its pieces merged (the original file's)
            else:
                got["sha"] = [digest.sha256_buffer(g._mm, stop) for _, g in files]
        except BaseException as exc:  # noqa: BLE001 - reported by the loading thread
            got["error"] = exc

    hasher = threading.Thread(target=hash_files, name=f"edgellama-sha256-{spec.name}", daemon=True)
    hasher.start()
    try:
        llm = load(spec.opts, file=f)
    except BaseException:
        stop.set()
        hasher.join()
        f.close()
        raise
    hasher.join()
    if "error" in got or got.get("sha") != wanted:
        llm.close()
        if "error" in got:
            raise VerifyError(f"sha256 could not be computed: {got['error']}")
        what = ("the file does not" if len(files) == 1 else
                "the pieces merged do not" if isinstance(want, str) else "a piece does not")
        found = next(g for g, w in zip(got["sha"], wanted, strict=True) if g != w)
        raise VerifyError(f"sha256 mismatch: {what} hash to the configured sha256 (found {found})")
    return llm


class ModelSet:
    """Every configured model, one lock (cond) over their states and the memory they hold."""

    def __init__(self, cfg: ModelsConfig, engine: EngineConfig, budget: int | None,
                 on_ready: Callable[[ModelHost], None], on_failed: Callable[[ModelHost, BaseException], None],
                 on_unloaded: Callable[[ModelHost], None] | None = None,
                 load: Callable[[ModelSpec], LLM] = verified_load) -> None:
        self.cfg = cfg
        self.budget = budget  # bytes all loaded models may take together; None: not checked (one model)
        self.on_ready, self.on_failed = on_ready, on_failed
        self.on_unloaded = on_unloaded or (lambda host: None)
        self.load = load
        self.cond = threading.Condition()
        self.hosts: dict[str, ModelHost] = {}
        for name, spec in cfg.models.items():
            per_model = EngineConfig(max_tokens=engine.max_tokens, queue=engine.queue, system_prompt=spec.system_prompt,
                                     log_prompts=engine.log_prompts, parallel=spec.opts.parallel or 1)
            self.hosts[name] = ModelHost(spec, per_model)
        self.live: dict[Scheduler, ModelHost] = {}  # schedulers holding memory: loading, loaded or draining
        self.retiring: set[Scheduler] = set()
        self.closing = False
        self.rng = random.Random()
        self.alias_counts: Counter[tuple[str, str]] = Counter()  # (alias, model) -> requests routed
        self.swaps = 0  # loads that had to unload another model first

    # ---- configuration ----
    def plan_all(self) -> None:
        """Each model's plan; a model whose file cannot be read is `failed` (the others serve); one that
        does not fit the budget even alone raises BudgetError naming it, with its plan."""
        for host in self.hosts.values():
            try:
                host.plan, host.plan_identity = plan_of(host.spec)
            except Exception as exc:  # noqa: BLE001 - this model fails; the service starts with the others
                self._mark_failed(host, exc)
                log.warning("model failed", extra={"fields": {"model": host.name, "reason": host.reason}})
                continue
            if self.budget is not None and host.plan.total > self.budget:
                raise BudgetError(f"model {host.name} does not fit the memory budget ({fmt_bytes(self.budget).strip()})"
                                  f" even alone:\n{host.plan.table()}")

    def resolve(self, name: str | None, pick: bool = True, req_id: Any = None) -> tuple[ModelHost, str | None]:
        """The model a request names (None: the default), and the alias it came through. An alias with
        several models picks one by weight (pick=False: its first, for a read-only view)."""
        alias = None
        if name is None:
            name = self.cfg.default
        if not self.cfg.several and name not in self.cfg.aliases:
            return next(iter(self.hosts.values())), None  # one model: any name is it, as before
        if name in self.cfg.aliases:
            alias, targets = name, self.cfg.aliases[name]
            if pick and len(targets) > 1:
                name = self.rng.choices([m for m, _ in targets], weights=[w for _, w in targets])[0]
            else:
                name = targets[0][0]
            if pick:
                with self.cond:
                    self.alias_counts[(alias, name)] += 1
        host = self.hosts.get(name)
        if host is None:
            raise P.ProtocolError(P.NOT_FOUND, f"model {name!r} not found (models: {', '.join(self.cfg.names())})",
                                  req_id)
        return host, alias

    # ---- the loop's calls ----
    def submit(self, host: ModelHost, job: Job) -> None:
        """Queues job on host's scheduler, starting a load if it has none; ProtocolError(busy, unavailable,
        shutdown) when it cannot be taken."""
        with self.cond:
            if self.closing:
                raise P.ProtocolError(P.SHUTDOWN, "the server is shutting down", job.req.id)
            if host.state == "failed":
                if host.source_identity() == host.failed_identity:
                    raise P.ProtocolError(P.UNAVAILABLE, f"model {host.name} is unavailable: {host.reason}",
                                          job.req.id)
                host.state, host.reason = "unloaded", ""  # its file changed: worth another try
            s = host.sched
            if s is not None and s.stopping:
                s = None
            elif s is not None and host.state == "loaded" and host.file_changed():
                log.info("model file changed: the next load reads the new one",
                         extra={"fields": {"model": host.name, "path": host.paths[0]}})
                s.refuse_new()  # what runs finishes on the old mapping (its file, not the new one)
                s = None
            job.scheduler = s if s is not None else self._new_scheduler(host)
            job.scheduler.submit(job)
            if s is None:
                job.scheduler.start()

    def load_now(self, name: str) -> ModelHost:
        """POST /models/load: loads the model (again, if it failed) without a request."""
        host, _ = self.resolve(name, pick=False)
        with self.cond:
            if self.closing:
                raise P.ProtocolError(P.SHUTDOWN, "the server is shutting down")
            if host.state == "failed":
                host.state, host.reason = "unloaded", ""
            if host.sched is None or host.sched.stopping:
                self._new_scheduler(host).start()
        return host

    def unload(self, name: str) -> bool:
        """POST /models/unload: unloads an idle model; False if it has a request running or queued
        (ProtocolError not_found for an unknown name)."""
        host, _ = self.resolve(name, pick=False)
        with self.cond:
            s = host.sched
            if s is None or s.stopping:
                return True
            if not s.try_retire():
                return False
            self.retiring.add(s)
            host.state = "unloaded"
            return True

    def touched(self, host: ModelHost, keep_alive: float | None) -> None:
        """A request of host's ended: it is the most recently used, and stays loaded for keep_alive."""
        ka = keep_alive if keep_alive is not None else (
            host.spec.keep_alive if host.spec.keep_alive is not None else self.cfg.keep_alive)
        if not self.cfg.several:
            ka = -1.0  # one model (a bare -m FILE) stays loaded, as it always has; -m NAME=FILE opts in
        with self.cond:
            host.last_used = time.monotonic()
            host.keep_until = None if ka < 0 else host.last_used + ka
            self.cond.notify_all()  # a load waiting for room may now unload it
        if ka == 0:
            self.reap()

    def reap(self) -> None:
        """Unloads the idle models whose keep_alive has run out."""
        now = time.monotonic()
        with self.cond:
            for host in self.hosts.values():
                s = host.sched
                if (s is not None and not s.stopping and host.state == "loaded" and host.keep_until is not None
                        and host.keep_until <= now and s.try_retire()):
                    log.info("model unloaded (keep_alive ran out)", extra={"fields": {"model": host.name}})
                    self.retiring.add(s)
                    host.state = "unloaded"

    def states(self) -> list[ModelInfo]:
        with self.cond:
            out = []
            for host in self.hosts.values():
                aliases = [a for a, ts in self.cfg.aliases.items() if any(m == host.name for m, _ in ts)]
                out.append(ModelInfo(host.name, str(host.spec.opts.model or ""), host.state, host.reason, aliases,
                                      host.plan.n_ctx if host.plan else 0, host.plan.total if host.plan else 0,
                                      host.loads))
            return out

    def schedulers(self) -> list[Scheduler]:
        """Every scheduler with a thread: loading, loaded or draining."""
        with self.cond:
            out = list(self.live)
            out += [h.sched for h in self.hosts.values() if h.sched is not None and h.sched not in self.live]
            return out

    def stop(self) -> None:
        """Shutdown: every scheduler stops (queued requests end with `shutdown`); loads waiting give up."""
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        for s in self.schedulers():
            s.stop()

    def refuse_new(self) -> None:
        with self.cond:
            self.closing = True
        for s in self.schedulers():
            s.refuse_new()

    def idle(self) -> bool:
        return all(s.idle() for s in self.schedulers())

    def held_bytes(self) -> int:
        with self.cond:
            return together([h.plan for h in self.live.values() if h.plan is not None])

    # ---- engine threads ----
    def _new_scheduler(self, host: ModelHost) -> Scheduler:
        """A scheduler for host (call with cond held); its thread loads the model once there is room."""
        holder: list[Scheduler] = []

        def load() -> LLM:
            self._acquire(host, holder[0])
            return self._load(host)

        s = Scheduler(load, host.engine, host.metrics, lambda: self._ready(host, holder[0]),
                      lambda exc: self._failed(host, holder[0], exc), lambda: self._closed(host, holder[0]),
                      name=host.name)
        holder.append(s)
        host.sched = s
        host.state = "loading"
        return s

    def _fits(self, host: ModelHost, others: list[ModelHost]) -> bool:
        if self.cfg.models_max and len(others) + 1 > self.cfg.models_max:
            return False
        if self.budget is None or host.plan is None:
            return True
        return together([h.plan for h in [*others, host] if h.plan is not None]) <= self.budget

    def _acquire(self, host: ModelHost, sched: Scheduler) -> None:
        """Blocks until host fits beside the models held (their memory counts until their threads have
        closed them), unloading idle ones for it, least recently used first; raises if the service stops."""
        if host.plan is None or host.source_identity() != host.plan_identity:
            host.plan, host.plan_identity = plan_of(host.spec)  # first, or another file now: its own plan
            if self.budget is not None and host.plan.total > self.budget:
                raise BudgetError(f"does not fit the memory budget even alone:\n{host.plan.table()}")
        evicted = False
        with self.cond:
            while True:
                if self.closing or sched.stopping:
                    raise Withdrawn("the server is shutting down" if self.closing else "unloaded before it loaded")
                if self._fits(host, list(self.live.values())):
                    self.live[sched] = host
                    self.swaps += evicted
                    return
                held = [h for s, h in self.live.items() if s not in self.retiring]
                for s, h in sorted(((s, h) for s, h in self.live.items() if s not in self.retiring),
                                   key=lambda sh: sh[1].last_used):
                    if self._fits(host, held):
                        break
                    if not s.try_retire():  # a request runs or waits on it: never unloaded under it
                        continue
                    log.info("model unloaded for another", extra={"fields": {"model": h.name, "for": host.name}})
                    self.retiring.add(s)
                    if h.sched is s:
                        h.state = "unloaded"
                    held.remove(h)
                    evicted = True
                self.cond.wait(timeout=0.1)

    def _load(self, host: ModelHost) -> LLM:
        llm = self.load(host.spec)
        files = model_files(llm.file)
        host.paths = [p for p, _ in files]
        host.identity = tuple(g.identity for _, g in files)
        return llm

    def _ready(self, host: ModelHost, sched: Scheduler) -> None:
        with self.cond:
            if host.sched is sched:
                host.state = "loaded"
                host.loads += 1
                host.last_used = time.monotonic()
                host.keep_until = None
        self.on_ready(host)

    def _failed(self, host: ModelHost, sched: Scheduler, exc: BaseException) -> None:
        with self.cond:
            if self.closing or isinstance(exc, Withdrawn):
                return
            if host.sched is sched:
                self._mark_failed(host, exc)
        log.warning("model failed", extra={"fields": {"model": host.name, "reason": host.reason}})
        if self.cfg.several:
            sched.abandon(P.UNAVAILABLE, f"model {host.name} is unavailable: {host.reason}")
        self.on_failed(host, exc)

    def _mark_failed(self, host: ModelHost, exc: BaseException) -> None:
        host.state = "failed"
        host.reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, BudgetError):
            host.reason = str(exc).replace("\n", " ")
        host.failed_identity = host.source_identity()

    def _closed(self, host: ModelHost, sched: Scheduler) -> None:
        # the last requests' objects (a generation and its callbacks) refer to each other and to the
        # tokenizer, whose arrays keep the file mapped: collected now, not at the interpreter's leisure,
        # so the mapping and the model's memory are gone before the memory counts as free
        gc.collect()
        _trim()
        with self.cond:
            self.live.pop(sched, None)
            self.retiring.discard(sched)
            if host.sched is sched:
                host.sched = None
                if host.state != "failed":
                    host.state = "unloaded"
            self.cond.notify_all()
        self.on_unloaded(host)


def _trim() -> None:
    """Hands the heap's free pages back to the OS (glibc's malloc_trim), so an unloaded model's Python
    objects (a 262k-token vocabulary) do not stay in the service's RSS."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the pages are reused by the next model instead
        pass


def fitting_sets(plans: dict[str, MemoryPlan], budget: int | None, models_max: int = 0) -> list[tuple[str, ...]]:
    """The largest sets of models that fit the budget (and --models-max) loaded together: every set that
    fits and to which no other model could be added. Models beyond 16 are not combined (2^n sets)."""
    from itertools import combinations

    names = list(plans)[:16]
    top = min(len(names), models_max or len(names))
    fits: list[tuple[str, ...]] = []
    for k in range(top, 0, -1):
        for combo in combinations(names, k):
            if budget is not None and together([plans[n] for n in combo]) > budget:
                continue
            if not any(set(combo) < set(f) for f in fits):
                fits.append(combo)
    return fits


def plan_report(cfg: ModelsConfig, budget: int | None) -> tuple[str, dict[str, Any], bool]:
    """`info --plan` on serve's flags: each model's plan, the sets that fit together; and whether every
    model fits alone (the service refuses to start otherwise)."""
    plans: dict[str, MemoryPlan] = {}
    doc: dict[str, Any] = {"budget_bytes": budget, "models_max": cfg.models_max, "models": {}}
    lines: list[str] = []
    ok = True
    for name, spec in cfg.models.items():
        try:
            plan, _ = plan_of(spec)
        except Exception as exc:  # noqa: BLE001 - reported for this model; the others are planned
            lines.append(f"model {name}: cannot plan: {exc}")
            doc["models"][name] = {"error": str(exc)}
            ok = False
            continue
        plan.budget = budget
        plans[name] = plan
        alone = budget is None or plan.total <= budget
        ok &= alone
        lines.append(f"model {name} ({spec.opts.model}), context {plan.n_ctx}"
                     + (f", {plan.n_seq} slots" if plan.n_seq > 1 else "") + ":")
        lines.append(plan.table())
        doc["models"][name] = plan.as_dict()
    sets = fitting_sets({n: p for n, p in plans.items() if budget is None or p.total <= budget}, budget,
                        cfg.models_max)
    doc["fit_together"] = [{"models": list(s), "total_bytes": together([plans[n] for n in s])} for s in sets]
    where = f"within {fmt_bytes(budget).strip()}" if budget is not None else "(no budget)"
    limit = f" and --models-max {cfg.models_max}" if cfg.models_max else ""
    lines.append(f"\nloaded together {where}{limit} (the interpreter's {BASE_OVERHEAD >> 20} MiB counted once):")
    for s in sets:
        lines.append(f"  {' + '.join(s):<50} {fmt_bytes(together([plans[n] for n in s]))}")
    too_big = [n for n, p in plans.items() if budget is not None and p.total > budget]
    for n in too_big:
        lines.append(f"  {n}: does NOT fit even alone (the service refuses to start)")
    if len(sets) > 1:
        lines.append("  models in different sets take turns: a request for one unloads idle others, least "
                     "recently used first")
    return "\n".join(lines) + "\n", doc, ok
