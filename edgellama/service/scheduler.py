"""The engine thread: owns the LLM, takes queued requests into its slots, runs prompt chunks and
decode steps, and reports events through each job's callback.

It never touches sockets; cancellation is a flag checked between prompt chunks and decode steps.
--parallel 1: one request at a time through LLM.generate. --parallel N: N slots (edgellama.slots),
one forward pass per step carrying every active request's decode token and new prompts' chunks.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgellama.service import protocol as P
from edgellama.service.metrics import Metrics
from edgellama.slots import common_prefix

log = logging.getLogger("edgellama.service")

# Test hook: while this file is absent, the engine thread blocks before each request (no heartbeat),
# as a hung decode would; the watchdog test uses it. Unset in production.
STALL_ENV = "EDGELLAMA_TEST_STALL_UNTIL"
_SENTINEL = "\ue000"  # a private-use character that no chat template emits


def render_chat(llm: Any, messages: list[dict[str, str]]) -> tuple[str, bool]:
    """The model's chat template applied to messages, and whether encoding must add BOS (a template
    writes it itself); the one call site of the chat renderer."""
    try:
        fmt = llm.chat
        return str(fmt.render(messages)), not fmt.added_special
    except ValueError as exc:  # no template in this model (names the pull command), or it refused the messages
        raise P.ProtocolError(P.BAD_REQUEST, f"chat messages refused: {exc}") from None


@dataclass
class Job:
    req: P.Completion
    emit: Callable[[dict[str, Any]], None]  # called from the engine thread (or the loop for queued jobs)
    t_arrival: float = field(default_factory=time.monotonic)
    cancelled: str | None = None  # "cancelled" (by the client), "gone" (client closed), "shutdown"
    finished: bool = False
    slot: int = -1
    stats: dict[str, Any] = field(default_factory=dict)
    output: list[str] = field(default_factory=list)  # kept only with --log-prompts
    prompt_text: str = ""


@dataclass
class EngineConfig:
    max_tokens: int = 512
    queue: int = 8
    system_prompt: str | None = None
    log_prompts: bool = False
    parallel: int = 1


class Scheduler:
    def __init__(self, load: Callable[[], Any], cfg: EngineConfig, metrics: Metrics,
                 on_ready: Callable[[], None], on_fatal: Callable[[BaseException], None]) -> None:
        self.load = load
        self.cfg = cfg
        self.metrics = metrics
        self.on_ready = on_ready
        self.on_fatal = on_fatal
        self.n_slots = max(1, cfg.parallel)
        self.llm: Any = None
        self.slots: Any = None  # edgellama.slots.Slots with --parallel > 1
        self.busy: dict[int, Job] = {}  # slot -> its job, with --parallel > 1
        self.status = "loading"
        self.cond = threading.Condition()
        self.queue: deque[Job] = deque()
        self.running: Job | None = None
        self.stopping = False
        self.heartbeat = time.monotonic()  # last sign of progress of the engine thread
        self.system_tokens: list[int] = []
        self.system_state = b""
        # the LoRA adapter scales of requests without a `lora` field: the start-up ones until POST
        # /lora-adapters sets others (under cond; read when a request is admitted, so it keeps them)
        self.lora_defaults: list[float] = []
        self.thread = threading.Thread(target=self._main, name="edgellama-engine", daemon=True)

    # ---- called from the I/O loop ----
    def start(self) -> None:
        self.thread.start()

    def submit(self, job: Job) -> None:
        """Queues job; raises ProtocolError(busy|shutdown) at once when it cannot be taken."""
        with self.cond:
            if self.stopping:
                raise P.ProtocolError(P.SHUTDOWN, "the server is shutting down", job.req.id)
            if len(self.queue) + self._n_busy() >= self.n_slots + self.cfg.queue:
                raise P.ProtocolError(P.BUSY, f"all {self.n_slots} slot(s) busy and the queue of "
                                      f"{self.cfg.queue} is full; retry later", job.req.id)
            self.queue.append(job)
            self.cond.notify_all()

    def cancel(self, job: Job, reason: str) -> None:
        """A queued job ends now; a running one at its next chunk or decode step."""
        with self.cond:
            if job.finished or job.cancelled:
                return
            job.cancelled = reason
            if job not in self.queue:
                return
            self.queue.remove(job)
            self._finish_locked(job, self._cancel_event(job))

    def stop(self) -> None:
        """Refuses new work, ends queued jobs with `shutdown` and the running one at its next step."""
        with self.cond:
            self.stopping = True
            while self.queue:
                job = self.queue.popleft()
                job.cancelled = "shutdown"
                self._finish_locked(job, P.error_event(job.req.id, P.SHUTDOWN, "the server is shutting down"))
            for job in self._busy_jobs():
                if not job.cancelled:
                    job.cancelled = "shutdown"
            self.cond.notify_all()

    def refuse_new(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    def idle(self) -> bool:
        with self.cond:
            return not self._n_busy() and not self.queue

    def lora_adapters(self) -> list[tuple[Any, float]]:
        """The loaded LoRA adapters in number order (LLM.loras) with their default scales; [] while loading."""
        with self.cond:
            if self.status != "ok":
                return []
            return list(zip(self.llm.loras, self.lora_defaults, strict=True))

    def set_lora_defaults(self, lora: list[tuple[int, float]]) -> None:
        """llama-server's POST /lora-adapters: later requests without a `lora` field run with the listed
        adapters at these scales, the others at 0; admitted ones keep theirs. An unknown id raises
        ProtocolError naming it, and nothing changes."""
        with self.cond:
            self.lora_defaults = P.scales_of(lora, len(self.lora_defaults), None)

    def _busy_jobs(self) -> list[Job]:
        """The unfinished jobs in slots (call with cond held). A job that has sent its last event no
        longer counts, though the engine thread may not have moved on yet: a client that got its
        answer and sends the next request at once must not find the slot still taken."""
        jobs = list(self.busy.values()) + ([self.running] if self.running is not None else [])
        return [j for j in jobs if not j.finished]

    def _n_busy(self) -> int:
        return len(self._busy_jobs())

    def slot_jobs(self) -> list[Job | None]:
        """Each slot's job, or None while it is idle."""
        with self.cond:
            if self.slots is None:
                return [self.running]
            return [self.busy.get(i) for i in range(self.n_slots)]

    def snapshot(self) -> dict[str, Any]:
        with self.cond:
            cached = 0
            if self.slots is not None:
                cached = sum(len(s.tokens) for s in self.slots.slots)
            elif self.llm is not None:
                cached = len(self.llm.tokens)
            return {"status": self.status, "slots": self.n_slots, "slots_busy": self._n_busy(),
                    "queue": len(self.queue), "queue_max": self.cfg.queue,
                    "n_ctx": self.llm.n_ctx if self.llm is not None else 0, "kv_cache_tokens": cached}

    # ---- the engine thread ----
    def _finish_locked(self, job: Job, event: dict[str, Any]) -> None:
        if job.finished:
            return
        job.finished = True
        job.stats.setdefault("outcome", event.get("stop_reason") or event.get("code"))
        self.metrics.outcome(str(job.stats["outcome"]))
        job.emit(event)

    def _finish(self, job: Job, event: dict[str, Any]) -> None:
        with self.cond:
            self._finish_locked(job, event)

    def _scales(self, req: P.Completion) -> list[float]:
        """The adapter scales req runs with, fixed when it is admitted: its `lora` field's, else the
        defaults of that moment; ProtocolError for an unknown id."""
        with self.cond:
            defaults = list(self.lora_defaults)
        scales = P.lora_scales(req, defaults)
        return defaults if scales is None else scales

    def _cancel_event(self, job: Job) -> dict[str, Any]:
        if job.cancelled == "shutdown":
            return P.error_event(job.req.id, P.SHUTDOWN, "the server is shutting down")
        return {"event": "done", "id": job.req.id, "stop_reason": "cancelled", "tokens_evaluated": 0,
                "tokens_predicted": 0, "tokens_cached": 0, "timings": {}}

    def _main(self) -> None:
        try:
            self.llm = self.load()
            if self.cfg.system_prompt:
                try:
                    self.llm.chat  # noqa: B018 - a system prompt is the start of chat turns: the model needs a template
                except ValueError as exc:
                    raise ValueError(f"--system-prompt needs a model with a chat template: {exc}") from None
                self.system_tokens = self._system_prefix(self.cfg.system_prompt)
                self.llm.prefill(self.system_tokens)
                self.system_state = self.llm.engine.state()  # n_used positions only: small
            with self.cond:
                self.lora_defaults = list(self.llm.lora_scales)
                self.status = "ok"
        except BaseException as exc:  # noqa: BLE001 - reported to the loop, which exits non-zero
            self.heartbeat = time.monotonic()
            self.on_fatal(exc)
            self.stop()
            return
        self.heartbeat = time.monotonic()
        if self.n_slots > 1:
            from edgellama.slots import Slots

            with self.cond:
                self.slots = Slots(self.llm)
        self.on_ready()
        if self.slots is not None:
            self._serve_slots()
            self.llm.close()
            return
        from edgellama.grammar.matcher import GrammarDeadEnd
        from edgellama.llm import ContextFull

        while True:
            with self.cond:
                while not self.queue and not self.stopping:
                    self.cond.wait(timeout=0.25)
                    self.heartbeat = time.monotonic()
                if not self.queue:
                    break
                job = self.queue.popleft()
                self.running = job
            try:
                self._run(job)
            except ContextFull as exc:  # a context shift that cannot make room (--no-context-shift, --keep)
                self._finish(job, P.error_event(job.req.id, P.CONTEXT, str(exc)))
                self.llm.reset()
            except GrammarDeadEnd as exc:  # the request's grammar needs a character no token has
                self._finish(job, P.error_event(job.req.id, P.BAD_REQUEST, f"grammar: {exc}"))
            except Exception as exc:  # noqa: BLE001 - an engine failure ends this request, not the service
                log.error("request failed: %s", exc, extra={"fields": {"id": job.req.id,
                                                                       "trace": traceback.format_exc()}})
                self._finish(job, P.error_event(job.req.id, P.INTERNAL, f"engine failure: {exc}"))
                self.llm.reset()
            finally:
                with self.cond:
                    self.running = None
                    if not job.finished:  # every request ends with exactly one done or error
                        self._finish_locked(job, P.error_event(job.req.id, P.INTERNAL, "request ended without a result"))
                self.heartbeat = time.monotonic()
        self.llm.close()

    # ---- --parallel N: slots stepped together ----
    def _serve_slots(self) -> None:
        """Each step: admit queued requests into idle slots, end cancelled ones, then one forward pass
        over every active slot (decode tokens first, prompt chunks within the batch) and a sampling
        step for each slot whose logits came back."""
        from edgellama.grammar.matcher import GrammarDeadEnd
        from edgellama.service.slot_request import SlotRequest

        active: dict[int, SlotRequest] = {}
        while True:
            with self.cond:
                while not self.queue and not self.busy and not self.stopping:
                    self.cond.wait(timeout=0.25)
                    self.heartbeat = time.monotonic()
                if not self.queue and not self.busy:
                    break
                admitted: list[Job] = []
                while self.queue and len(self.busy) + len(admitted) < self.n_slots:
                    admitted.append(self.queue.popleft())
            for job in admitted:
                r = self._admit(job)
                if r is not None:
                    active[r.slot.index] = r
            for i, r in list(active.items()):
                if r.job.cancelled:
                    self._end(active, i, "cancelled")
            if not active:
                continue
            failed: dict[int, Exception] = {}
            try:
                ready = self.slots.step(failed)
            except Exception as exc:  # noqa: BLE001 - an engine failure ends these requests, not the service
                log.error("step failed: %s", exc, extra={"fields": {"trace": traceback.format_exc()}})
                for i in list(active):
                    self._end(active, i, error=P.error_event(active[i].job.req.id, P.INTERNAL, f"engine failure: {exc}"))
                continue
            for i, why in failed.items():  # a slot whose context cannot make room (--no-context-shift, --keep)
                self._end(active, i, error=P.error_event(active[i].job.req.id, P.CONTEXT, str(why)))
            for i, logits in ready.items():
                try:
                    tok, reason = active[i].on_logits(logits)
                except GrammarDeadEnd as exc:  # this request's grammar needs a character no token has
                    self._end(active, i, error=P.error_event(active[i].job.req.id, P.BAD_REQUEST, f"grammar: {exc}"))
                    continue
                if reason is not None:
                    self._end(active, i, reason)
                else:
                    assert tok is not None
                    self.slots.feed(active[i].slot, tok)
            self.heartbeat = time.monotonic()

    def _admit(self, job: Job) -> Any:
        """A queued job into an idle slot (the one whose cache shares most of its prompt); None when it
        ended at once (cancelled, a bad request, a prompt too long for a slot's context)."""
        from edgellama.service.slot_request import SlotRequest

        self._stalled_by_test()
        llm, req, slots = self.llm, job.req, self.slots
        t_start = time.monotonic()
        job.stats["queue_ms"] = round((t_start - job.t_arrival) * 1000.0, 2)
        self.metrics.queue_wait(t_start - job.t_arrival)
        if job.cancelled:
            self._finish(job, self._cancel_event(job))
            return None
        try:
            ids = self._tokens(job)
        except P.ProtocolError as exc:
            self._finish(job, P.error_event(req.id, exc.code, str(exc)))
            return None
        job.stats["n_prompt"] = len(ids)
        if len(ids) >= llm.n_ctx:
            self._finish(job, P.error_event(req.id, P.CONTEXT, f"the prompt has {len(ids)} tokens; the context "
                                            f"holds {llm.n_ctx} (-c), with room for at least one more"))
            return None
        try:
            scales = self._scales(req)
        except P.ProtocolError as exc:
            self._finish(job, P.error_event(req.id, exc.code, str(exc)))
            return None
        slot = slots.best_slot(ids, scales)
        assert slot is not None  # admitted only while a slot is idle
        try:
            slots.use_scales(slot, scales)
            if not req.cache_prompt:
                llm.engine.seq_clear(slot.index)
                slot.tokens = []
            sys_n = len(self.system_tokens)
            if (self.system_state and common_prefix(slot.tokens, ids) < sys_n and ids[:sys_n] == self.system_tokens
                    and llm.seq_scales(slot.index) == tuple(llm.lora_scales)):  # the state has the start-up scales
                slots.load(slot, self.system_tokens, self.system_state)  # the system prompt's KV, not evaluated again
            n_cached = slots.start(slot, ids)
        except Exception as exc:  # noqa: BLE001 - this request fails, the others go on
            log.error("request failed: %s", exc, extra={"fields": {"id": req.id, "trace": traceback.format_exc()}})
            llm.engine.seq_clear(slot.index)
            slot.tokens = []
            self._finish(job, P.error_event(req.id, P.INTERNAL, f"engine failure: {exc}"))
            return None
        job.slot = slot.index
        with self.cond:
            self.busy[slot.index] = job
        return SlotRequest(job, slot, ids, n_cached, llm, self.cfg.max_tokens, t_start, self.cfg.log_prompts)

    def _end(self, active: dict[int, Any], i: int, reason: str = "", error: dict[str, Any] | None = None) -> None:
        """Ends slot i's request with its done event (or error) and frees the slot; after an error the
        slot's cache is cleared (it may hold a half-evaluated prompt)."""
        r = active.pop(i)
        if error is None:
            event = r.done_event(reason, self.metrics)
        else:
            event = error
            self.llm.engine.seq_clear(i)
            r.slot.tokens = []
        self.slots.release(r.slot)
        with self.cond:
            self.busy.pop(i, None)
            self._finish_locked(r.job, event)

    def _system_prefix(self, system: str) -> list[int]:
        """The tokens every chat turn with this system prompt starts with (the template up to the user text)."""
        text, add_special = render_chat(self.llm, [{"role": "system", "content": system},
                                                   {"role": "user", "content": _SENTINEL}])
        prefix = text[:text.index(_SENTINEL)]
        tokens: list[int] = self.llm.tokenizer.encode(prefix, add_special=add_special, parse_special=True)
        return tokens

    def _tokens(self, job: Job) -> list[int]:
        req, tok = job.req, self.llm.tokenizer
        if req.messages is not None:
            messages = req.messages
            if self.cfg.system_prompt and not any(m["role"] == "system" for m in messages):
                messages = [{"role": "system", "content": self.cfg.system_prompt}, *messages]
            text, add_special = render_chat(self.llm, messages)
            parse_special = True
        else:
            text = req.prompt or ""
            parse_special, add_special = req.special, True
        if self.cfg.log_prompts:
            job.prompt_text = text
        ids: list[int] = tok.encode(text, add_special=add_special, parse_special=parse_special)
        return ids

    def _stalled_by_test(self) -> None:
        path = os.environ.get(STALL_ENV)
        while path and not os.path.exists(path):
            time.sleep(0.05)  # deliberately no heartbeat: the watchdog must stop

    def _run(self, job: Job) -> None:
        from edgellama.sampling import Sampler, SamplerParams

        self._stalled_by_test()
        llm, req = self.llm, job.req
        t_start = time.monotonic()
        job.slot = 0
        job.stats["queue_ms"] = round((t_start - job.t_arrival) * 1000.0, 2)
        self.metrics.queue_wait(t_start - job.t_arrival)
        if job.cancelled:
            self._finish(job, self._cancel_event(job))
            return
        try:
            ids = self._tokens(job)
        except P.ProtocolError as exc:
            self._finish(job, P.error_event(req.id, exc.code, str(exc)))
            return
        job.stats["n_prompt"] = len(ids)
        if len(ids) >= llm.n_ctx:
            self._finish(job, P.error_event(req.id, P.CONTEXT, f"the prompt has {len(ids)} tokens; the context "
                                            f"holds {llm.n_ctx} (-c), with room for at least one more"))
            return
        n_predict = self.cfg.max_tokens if req.n_predict < 0 else min(req.n_predict, self.cfg.max_tokens)
        params = SamplerParams(temp=req.temperature, top_k=req.top_k, top_p=req.top_p, min_p=req.min_p,
                               repeat_penalty=req.repeat_penalty, repeat_last_n=req.repeat_last_n, seed=req.seed)
        sampler: Any = Sampler(params, llm.n_ctx)
        if req.constraint is not None:
            from edgellama.grammar import constrain

            sampler = constrain(sampler, req.constraint, llm.tokenizer)
        try:
            llm.use_lora_scales(self._scales(req), 0)  # a cache of other scales is cleared
        except P.ProtocolError as exc:
            self._finish(job, P.error_event(req.id, exc.code, str(exc)))
            return
        if not req.cache_prompt:
            llm.reset()

        # the prompt in chunks of n_batch, so cancel and shutdown are seen between chunks; generate() evaluates
        # the last chunk (LLM.prefill reuses what the cache holds), so the forward passes are those of `run`
        common = common_prefix(llm.tokens, ids)
        sys_n = len(self.system_tokens)
        if (self.system_state and common < sys_n and ids[:sys_n] == self.system_tokens
                and llm.seq_scales(0) == tuple(llm.lora_scales)):  # the state has the start-up scales
            # another prompt took the cache since: put the system prompt's KV back instead of evaluating it
            llm.engine.load_state(self.system_state)
            llm.tokens = list(self.system_tokens)
            common = common_prefix(llm.tokens, ids)
        n_eval, n_chunks = 0, 0
        end = min(common, len(ids) - 1)
        while len(ids) - end > llm.n_batch:
            if job.cancelled:
                self._finish(job, self._cancel_event(job))
                return
            end += llm.n_batch
            llm.prefill(ids[:end])
            n_eval += llm.n_prompt_evaluated
            n_chunks += 1
            self.heartbeat = time.monotonic()
        t_prompt_done = [0.0]

        def on_prompt() -> None:
            t_prompt_done[0] = time.monotonic()

        def should_stop() -> bool:
            self.heartbeat = time.monotonic()
            return job.cancelled is not None

        stops = req.stop
        pending = ""
        reason = "length"
        n_predicted = 0
        for ev in llm.generate(ids, sampler, n_predict, should_stop=should_stop, on_prompt=on_prompt):
            if ev.kind == "token":
                n_predicted += 1
                if n_predicted == 1:
                    job.stats["ttft_ms"] = round((time.monotonic() - job.t_arrival) * 1000.0, 2)
            else:
                n_eval += ev.timings.prompt_tokens
                reason = {"stop": "eos"}.get(ev.stop_reason, ev.stop_reason)
                n_predicted = ev.timings.gen_tokens
            pending += ev.text
            out, pending, hit = _split_stop(pending, stops, final=ev.kind == "done")
            if out:
                if self.cfg.log_prompts or not req.stream:
                    job.output.append(out)
                if req.stream:
                    job.emit({"event": "token", "id": req.id, "text": out})
            if hit:
                reason = "stop"
                break
        t_end = time.monotonic()
        if t_prompt_done[0] == 0.0:
            t_prompt_done[0] = t_end
        prompt_s = t_prompt_done[0] - t_start
        gen_s = t_end - t_prompt_done[0]
        n_cached = len(ids) - n_eval
        self.metrics.prompt(n_eval, n_cached, prompt_s, n_chunks + 1)
        self.metrics.predicted(n_predicted, gen_s)
        timings = {"queue_ms": job.stats["queue_ms"], "prompt_n": n_eval, "prompt_ms": round(prompt_s * 1000.0, 2),
                   "predicted_n": n_predicted, "predicted_ms": round(gen_s * 1000.0, 2),
                   "predicted_per_second": round(n_predicted / gen_s, 2) if gen_s > 0 else 0.0}
        job.stats.update(n_eval=n_eval, n_cached=n_cached, n_predicted=n_predicted,
                         prompt_ms=timings["prompt_ms"], gen_ms=timings["predicted_ms"])
        if reason == "cancelled" or job.cancelled:
            self._finish(job, self._cancel_event(job) | ({"tokens_evaluated": n_eval, "tokens_predicted": n_predicted,
                                                          "tokens_cached": n_cached, "timings": timings}
                                                         if job.cancelled != "shutdown" else {}))
            return
        done: dict[str, Any] = {"event": "done", "id": req.id, "stop_reason": reason, "tokens_evaluated": n_eval,
                                "tokens_predicted": n_predicted, "tokens_cached": n_cached, "timings": timings}
        if not req.stream:
            done["content"] = "".join(job.output)
        self._finish(job, done)


def _split_stop(text: str, stops: list[str], final: bool) -> tuple[str, str, bool]:
    """(text to send, text held back, stop string found): held back is the longest tail that could
    still grow into a stop string, so a stop string is never half sent."""
    if not stops:
        return text, "", False
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    if hits:
        return text[:min(hits)], "", True
    if final:
        return text, "", False
    keep = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), keep, -1):
            if text.endswith(s[:k]):
                keep = k
                break
    return text[:len(text) - keep], text[len(text) - keep:], False
