"""The engine thread: owns the LLM, takes queued requests into its slots (edgellama.slots; --parallel 1
is one slot), runs one forward pass per step carrying every active request's decode token and new
prompts' chunks, feeds each request's Generation, and reports events through each job's callback.

An embeddings request (--embedding) runs whole between steps, when no generation is under way: its texts
take the engine's sequences together (edgellama.embedding), so the slots' caches are cleared after it; the
queue stays in order (generation requests behind it wait for it).

It never touches sockets; cancellation is a flag checked every step. A failure inside one request
(admitting, evaluating, sampling, detokenizing, streaming, ending) ends that request with an error
event and frees its slot; the engine thread and the other requests go on.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgellama import params as R
from edgellama.generation import Generation, NonFiniteLogits, build_sampler, effective_n_predict
from edgellama.grammar.matcher import GrammarDeadEnd
from edgellama.sequence import ContextFull, common_prefix
from edgellama.service import protocol as P
from edgellama.service.job import Job
from edgellama.service.metrics import Metrics
from edgellama.service.slot_request import SlotRequest
from edgellama.slots import Slots
from edgellama.tokenizers.chat import ChatPrompt, render_prompt, system_prefix

if TYPE_CHECKING:
    from edgellama.llm import LLM
    from edgellama.tool_stream import ToolStream

__all__ = ["EngineConfig", "Job", "Scheduler", "render_chat"]

log = logging.getLogger("edgellama.service")

# Test hooks, unset in production. STALL: while this file is absent, the engine thread blocks before each
# request (no heartbeat), as a hung decode would; the watchdog test uses it. FAULT: a stage name (admit,
# evaluate, sample, detokenize, stream, finish): a request whose prompt text holds FAULT_MARK raises there.
STALL_ENV = "EDGELLAMA_TEST_STALL_UNTIL"
FAULT_ENV = "EDGELLAMA_TEST_FAULT"
FAULT_MARK = "<inject-fault>"
FAULT_STAGES = ("admit", "evaluate", "sample", "detokenize", "stream", "finish")


def render_chat(llm: LLM, messages: list[dict[str, Any]], system: str | None = None,
                tools: list[dict[str, Any]] | None = None) -> ChatPrompt:
    """The model's chat format applied to messages (tokenizers.chat.render_prompt), a refusal as the
    client's fault: no template in this model (the message names the pull command), or it refused them."""
    try:
        return render_prompt(llm.chat, messages, system, tools=tools)
    except ValueError as exc:
        raise P.ProtocolError(P.BAD_REQUEST, f"chat messages refused: {exc}") from None


@dataclass
class EngineConfig:
    max_tokens: int = 512
    queue: int = 8
    system_prompt: str | None = None
    log_prompts: bool = False
    parallel: int = 1


class Scheduler:
    def __init__(self, load: Callable[[], LLM], cfg: EngineConfig, metrics: Metrics,
                 on_ready: Callable[[], None], on_fatal: Callable[[BaseException], None],
                 on_closed: Callable[[], None] | None = None, name: str = "") -> None:
        """load runs first on the engine thread (a model set's load first waits for room in the RAM budget);
        on_fatal(exc) if it raises (it may abandon() the queued requests with its own error, before stop()
        ends the rest with `shutdown`); on_closed once the thread is done with the model (closed, or never
        loaded): its memory is free."""
        self.load = load
        self.cfg = cfg
        self.metrics = metrics
        self.on_ready = on_ready
        self.on_fatal = on_fatal
        self.on_closed = on_closed or (lambda: None)
        self.n_slots = max(1, cfg.parallel)
        self.llm: LLM | None = None
        self.slots: Slots | None = None  # one slot per --parallel
        self.busy: dict[int, Job] = {}  # slot -> its job
        self.status = "loading"
        self.cond = threading.Condition()
        self.queue: deque[Job] = deque()
        self.stopping = False
        self.heartbeat = time.monotonic()  # last sign of progress of the engine thread
        self.system_tokens: list[int] = []
        self.system_state = b""
        # the LoRA adapter scales of requests without a `lora` field: the start-up ones until POST
        # /lora-adapters sets others (under cond; read when a request is admitted, so it keeps them)
        self.lora_defaults: list[float] = []
        self.thread = threading.Thread(target=self._main, name=f"edgellama-engine{'-' + name if name else ''}",
                                       daemon=True)

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
            self.abandon(P.SHUTDOWN, "the server is shutting down")
            for job in self._busy_jobs():
                if not job.cancelled:
                    job.cancelled = "shutdown"
            self.cond.notify_all()

    def abandon(self, code: str, message: str) -> None:
        """Refuses new work and ends every queued job with this error (the running ones go on)."""
        with self.cond:
            self.stopping = True
            while self.queue:
                job = self.queue.popleft()
                job.cancelled = "shutdown"
                self._finish_locked(job, P.error_event(job.req.id, code, message))
            self.cond.notify_all()

    def try_retire(self) -> bool:
        """Stops the engine thread (which then closes the model) if nothing runs or waits; False if busy."""
        with self.cond:
            if self.queue or self._n_busy():
                return False
            self.stopping = True
            self.cond.notify_all()
            return True

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
            if self.status != "ok" or self.llm is None:
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
        return [j for j in self.busy.values() if not j.finished]

    def _n_busy(self) -> int:
        return len(self._busy_jobs())

    def slot_jobs(self) -> list[Job | None]:
        """Each slot's job, or None while it is idle."""
        with self.cond:
            return [self.busy.get(i) for i in range(self.n_slots)]

    def snapshot(self) -> dict[str, Any]:
        with self.cond:
            cached = sum(len(s.tokens) for s in self.slots.slots) if self.slots is not None else 0
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
        try:
            job.emit(event)
        except Exception as exc:  # noqa: BLE001 - a broken emitter loses this answer, nothing else
            log.error("could not deliver the last event: %s", exc,
                      extra={"fields": {"id": job.req.id, "trace": traceback.format_exc()}})

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
        if not self._open():
            self.on_closed()
            return
        self.heartbeat = time.monotonic()
        self.on_ready()
        try:
            self._serve()
        finally:
            self._close()
            self.on_closed()

    def _open(self) -> bool:
        """Loads the model (and evaluates the system prompt); False, reported to on_fatal, if that fails."""
        try:
            llm = self.llm = self.load()
            slots = Slots(llm)
            if self.cfg.system_prompt:
                try:
                    llm.chat  # noqa: B018 - a system prompt is the start of chat turns: the model needs a template
                except ValueError as exc:
                    raise ValueError(f"--system-prompt needs a model with a chat template: {exc}") from None
                self.system_tokens = system_prefix(llm.chat, self.cfg.system_prompt).encode(llm.tokenizer)
                llm.prefill(self.system_tokens)
                self.system_state = llm.engine.seq_state(0)  # n_used positions only: small
            with self.cond:
                self.slots = slots
                self.lora_defaults = list(llm.lora_scales)
                self.status = "ok"
            return True
        except BaseException as exc:  # noqa: BLE001 - reported to the loop (one model: it exits non-zero)
            self.heartbeat = time.monotonic()
            self._close()
            self.on_fatal(exc)
            self.stop()
            return False

    def _close(self) -> None:
        """Closes the model and drops every reference to it, so its mapping and memory go now."""
        with self.cond:
            llm, self.llm, self.slots, self.status = self.llm, None, None, "closed"
        if llm is not None:
            llm.close()

    def _serve(self) -> None:
        """Each step: admit queued requests into idle slots, end cancelled ones, then one forward pass
        over every active slot (decode tokens first, prompt chunks within the batch) and a sampling
        step for each slot whose logits came back. Whatever one request raises ends that request."""
        active: dict[int, SlotRequest] = {}
        while True:
            with self.cond:
                while not self.queue and not self.busy and not self.stopping:
                    self.cond.wait(timeout=0.25)
                    self.heartbeat = time.monotonic()
                if not self.queue and not self.busy:
                    break
                admitted: list[Job] = []
                embed: Job | None = None
                while self.queue and len(self.busy) + len(admitted) < self.n_slots:
                    if isinstance(self.queue[0].req, P.Embedding):  # in turn, once no generation runs
                        if not self.busy and not admitted:
                            embed = self.queue.popleft()
                        break
                    admitted.append(self.queue.popleft())
            if embed is not None:
                self._embed(embed)
                self.heartbeat = time.monotonic()
                continue
            try:
                self._step(active, admitted)
            except Exception as exc:  # noqa: BLE001 - a bug of the loop itself: end what runs, keep serving
                log.error("engine step failed: %s", exc, extra={"fields": {"trace": traceback.format_exc()}})
                for job in admitted:
                    if job.slot < 0:
                        self._finish(job, P.error_event(job.req.id, P.INTERNAL, f"engine failure: {exc}"))
                for i in list(active):
                    self._fail(active, i, exc)
            self.heartbeat = time.monotonic()

    def _step(self, active: dict[int, SlotRequest], admitted: list[Job]) -> None:
        for job in admitted:
            r = self._admit(job)
            if r is not None:
                active[r.slot.index] = r
        for i, r in list(active.items()):
            if r.job.cancelled:
                self._end(active, i, "cancelled")
        if not active:
            return
        for i, why in self._evaluate(active).items():
            if isinstance(why, ContextFull):  # a slot whose context cannot make room (--no-context-shift, --keep)
                self._end(active, i, error=P.error_event(active[i].job.req.id, P.CONTEXT, str(why)))
            elif isinstance(why, Exception):
                self._fail(active, i, why)
            else:
                self._sample(active, i, why)

    def _evaluate(self, active: dict[int, SlotRequest]) -> dict[int, Any]:
        """One forward pass: {slot: logits} for the slots ready to sample, {slot: exception} for those that
        failed. A pass that fails is run again one slot at a time, so only the failing slot is ended
        (the engine writes no cache unless a whole batch is valid)."""
        assert self.slots is not None
        failed: dict[int, Exception] = {}
        try:
            self._fault("evaluate", [r.job for r in active.values() if r.slot.pending])
            out: dict[int, Any] = dict(self.slots.step(failed))
        except Exception:  # noqa: BLE001 - find the slot that fails
            out = {}
            for i, r in active.items():
                if not r.slot.pending or i in failed:
                    continue
                try:
                    self._fault("evaluate", [r.job])
                    out.update(self.slots.step(failed, only={i}))
                except Exception as exc:  # noqa: BLE001 - this slot's request ends, the others go on
                    failed[i] = exc
        return {**out, **failed}

    def _sample(self, active: dict[int, SlotRequest], i: int, logits: Any) -> None:
        assert self.slots is not None
        r = active[i]
        try:
            self._fault("sample", [r.job])
            tok = r.step(logits)
        except GrammarDeadEnd as exc:  # this request's grammar needs a character no token has
            self._end(active, i, error=P.error_event(r.job.req.id, P.BAD_REQUEST, f"grammar: {exc}"))
            return
        except Exception as exc:  # noqa: BLE001 - NonFiniteLogits, a fault while sampling or streaming
            self._fail(active, i, exc)
            return
        if tok is None:
            self._end(active, i)
        elif r.slot.seq.must_end():
            self._end(active, i, "context")
        else:
            self.slots.feed(r.slot, tok)

    def _fault(self, stage: str, jobs: list[Job]) -> None:
        if os.environ.get(FAULT_ENV) == stage and any(FAULT_MARK in j.prompt_text for j in jobs):
            raise RuntimeError(f"injected fault at {stage}")

    def _embed(self, job: Job) -> None:
        """An embeddings request, whole: every input's vector in one `done` event, or one error event."""
        from edgellama.embedding import EmbeddingError, TextTooLong, check_token_ids

        llm, slots = self.llm, self.slots
        assert llm is not None and slots is not None
        req = job.req
        assert isinstance(req, P.Embedding)
        t0 = time.monotonic()
        job.stats["queue_ms"] = round((t0 - job.t_arrival) * 1000.0, 2)
        self.metrics.queue_wait(t0 - job.t_arrival)
        if job.cancelled:
            self._finish(job, self._cancel_event(job))
            return
        try:
            toks = [llm.tokenize(x, add_bos=True, special=True) if isinstance(x, str) else list(x) for x in req.inputs]
            check_token_ids(toks, llm.n_vocab)
            job.stats["n_prompt"] = n = sum(len(t) for t in toks)
            try:
                vecs = llm.embed_tokens(toks, req.embd_normalize if llm.pooling != "none" else -1)
            finally:
                for slot in slots.slots:  # the texts ran in the slots' sequences
                    slot.seq.clear()
            seconds = time.monotonic() - t0
            self.metrics.prompt(n, 0, seconds, 0)
            job.stats["prompt_ms"] = round(seconds * 1000.0, 2)
            job.stats["outcome"] = "embedding"
            self._finish(job, {"event": "done", "id": req.id, "embeddings": [v.tolist() for v in vecs],
                               "n_tokens": [len(t) for t in toks], "tokens_evaluated": n,
                               "pooling": llm.pooling, "n_embd": llm.desc.n_embd})
        except EmbeddingError as exc:  # the client's: a bad token id, an empty text, a text past the context
            code = P.CONTEXT if isinstance(exc, TextTooLong) else P.BAD_REQUEST
            self._finish(job, P.error_event(req.id, code, str(exc)))
        except Exception as exc:  # noqa: BLE001 - this request ends, the service goes on
            log.error("embedding request failed: %s", exc,
                      extra={"fields": {"id": req.id, "trace": traceback.format_exc()}})
            self._finish(job, P.error_event(req.id, P.INTERNAL, f"engine failure: {exc}"))

    def _admit(self, job: Job) -> SlotRequest | None:
        """A queued job into an idle slot (the one whose cache shares most of its prompt); None when it
        ended at once (cancelled, a bad request, a prompt too long for a slot's context, a fault)."""
        llm, slots = self.llm, self.slots
        assert llm is not None and slots is not None
        self._stalled_by_test()
        req = job.req
        assert isinstance(req, P.Completion)  # embeddings run in _embed
        now = time.monotonic()
        job.stats["queue_ms"] = round((now - job.t_arrival) * 1000.0, 2)
        self.metrics.queue_wait(now - job.t_arrival)
        t_start = time.perf_counter()  # the request's prompt time counts from here (Generation's clock)
        if job.cancelled:
            self._finish(job, self._cancel_event(job))
            return None
        slot = None
        try:
            if not llm.generates:
                raise P.ProtocolError(P.BAD_REQUEST, f"{llm.path.name} is an embedding model ({llm.hp.arch}): it "
                                      f"answers embeddings requests only", req.id)
            ids = self._tokens(job)
            job.stats["n_prompt"] = len(ids)
            if not ids:
                raise P.ProtocolError(P.BAD_REQUEST, "field 'prompt' gives no tokens", req.id)
            if len(ids) >= llm.n_ctx:
                raise P.ProtocolError(P.CONTEXT, f"the prompt has {len(ids)} tokens; the context holds "
                                      f"{llm.n_ctx} (-c), with room for at least one more", req.id)
            scales = self._scales(req)
            tools = self._tool_stream(req)
            self._fault("admit", [job])
            slot = slots.best_slot(ids, scales)
            assert slot is not None  # admitted only while a slot is idle
            slots.use_scales(slot, scales)
            if not req.cache_prompt:
                slot.seq.clear()
            sys_n = len(self.system_tokens)
            if (self.system_state and common_prefix(slot.tokens, ids) < sys_n and ids[:sys_n] == self.system_tokens
                    and llm.seq_scales(slot.index) == tuple(llm.lora_scales)):  # the state has the start-up scales
                slots.load(slot, self.system_tokens, self.system_state)  # the system prompt's KV, not evaluated again
            n_cached = slots.start(slot, ids)
            r = SlotRequest(job, slot, len(ids), n_cached, llm.n_batch, t_start, self.cfg.log_prompts, tools)
            stops = list(req.stop) + (list(llm.chat.stop_pieces) if req.messages is not None else [])
            r.gen = Generation(llm.tokenizer, ids, build_sampler(req, llm.tokenizer, llm.n_ctx),
                               n_predict=effective_n_predict(req.n_predict, self.cfg.max_tokens), stops=stops,
                               emit=self._emitter(r), model=llm.path.name, n_cached=n_cached,
                               n_probs=req.probs_wanted, post_sampling=req.post_sampling_probs, t_start=t_start)
        except P.ProtocolError as exc:
            self._refuse(job, slot, P.error_event(req.id, exc.code, str(exc)))
            return None
        except R.ParamError as exc:  # a parameter only the model can judge (a logit_bias token id)
            self._refuse(job, slot, P.error_event(req.id, P.BAD_REQUEST, str(exc)))
            return None
        except Exception as exc:  # noqa: BLE001 - this request fails, the others go on
            log.error("request failed: %s", exc, extra={"fields": {"id": req.id, "trace": traceback.format_exc()}})
            self._refuse(job, slot, P.error_event(req.id, P.INTERNAL, f"engine failure: {exc}"))
            return None
        job.slot = slot.index
        with self.cond:
            self.busy[slot.index] = job
        return r

    def _tool_stream(self, req: P.Completion) -> ToolStream | None:
        """The reply's stream of content and calls when req may call tools (None otherwise); req's
        constraint becomes the grammar of a call (required, a named function: from the first token; auto:
        from a call's marker), so a call parses, and its deltas stream as it is written."""
        from edgellama.tool_calls import call_format, choice_grammar
        from edgellama.tool_stream import ToolStream

        if not req.tools or req.tool_choice == "none":
            return None
        assert self.llm is not None
        fmt = call_format(getattr(self.llm.chat, "source", ""))
        live = req.constraint is None
        if live:
            req.constraint = choice_grammar(fmt, req.tools, req.tool_choice, req.parallel_tool_calls)
        return ToolStream(fmt, req.tools, live)

    def _refuse(self, job: Job, slot: Any, event: dict[str, Any]) -> None:
        if slot is not None:
            slot.seq.clear()  # it may hold a half-loaded state
            slot.busy = False
            slot.pending = []
        self._finish(job, event)

    def _emitter(self, r: SlotRequest) -> Callable[[str, int], None]:
        def emit(text: str, token: int) -> None:
            self._fault("detokenize", [r.job])
            if text:
                self._fault("stream", [r.job])
            r.send(text, token)

        return emit

    def _fail(self, active: dict[int, SlotRequest], i: int, exc: BaseException) -> None:
        """Slot i's request ends with an internal error (the message names the failure), its cache cleared."""
        r = active[i]
        if isinstance(exc, NonFiniteLogits):
            message = str(exc)
        else:
            message = f"engine failure: {exc}"
            log.error("request failed: %s", exc, extra={"fields": {"id": r.job.req.id,
                                                                   "trace": traceback.format_exc()}})
        self._end(active, i, error=P.error_event(r.job.req.id, P.INTERNAL, message))

    def _end(self, active: dict[int, SlotRequest], i: int, reason: str | None = None,
             error: dict[str, Any] | None = None) -> None:
        """Ends slot i's request with its done event (or error) and frees the slot; after an error the
        slot's cache is cleared (it may hold a half-evaluated prompt)."""
        assert self.slots is not None
        r = active.pop(i)
        event = error
        if event is None:
            try:
                self._fault("finish", [r.job])
                event = r.done_event(reason, self.metrics)
            except Exception as exc:  # noqa: BLE001 - the request still gets exactly one last event
                log.error("request failed: %s", exc, extra={"fields": {"id": r.job.req.id,
                                                                       "trace": traceback.format_exc()}})
                event = P.error_event(r.job.req.id, P.INTERNAL, f"engine failure: {exc}")
        if event["event"] == "error":
            try:
                r.slot.seq.clear()
            except Exception as exc:  # noqa: BLE001 - the next prompt in this slot starts over anyway
                log.error("clearing slot %d failed: %s", i, exc)
                r.slot.seq.tokens = []
        self.slots.release(r.slot)
        with self.cond:
            self.busy.pop(i, None)
            self._finish_locked(r.job, event)

    def _tokens(self, job: Job) -> list[int]:
        llm = self.llm
        assert llm is not None
        req = job.req
        assert isinstance(req, P.Completion)
        if req.messages is not None:
            chat = render_chat(llm, req.messages, self.cfg.system_prompt,
                               req.tools if req.tool_choice != "none" else None)
            job.prompt_text = chat.text
            return chat.encode(llm.tokenizer)
        if isinstance(req.prompt, list):  # llama-server's token prompt: ids as given, strings tokenized in place
            job.prompt_text = json.dumps(req.prompt)[:2000]
            ids = []
            for i, part in enumerate(req.prompt):
                if isinstance(part, str):
                    ids += llm.tokenizer.encode(part, add_special=i == 0, parse_special=req.special)
                else:
                    try:
                        R.check_token_ids("prompt", [part], llm.n_vocab)
                    except R.ParamError as exc:
                        raise P.ProtocolError(P.BAD_REQUEST, str(exc), req.id) from None
                    ids.append(part)
            return ids
        job.prompt_text = req.prompt or ""
        ids = llm.tokenizer.encode(job.prompt_text, add_special=True, parse_special=req.special)
        return ids

    def _stalled_by_test(self) -> None:
        path = os.environ.get(STALL_ENV)
        while path and not os.path.exists(path):
            time.sleep(0.05)  # deliberately no heartbeat: the watchdog must stop
