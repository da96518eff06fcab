"""One request in a slot of the scheduler: its Generation (edgellama.generation: sampling, stop strings,
streaming text) fed the slot's logits step by step, its token events, and its done event with the
timings llama-server reports. Knows nothing of sockets; the scheduler decides when it starts and ends.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from edgellama.generation import Generation
from edgellama.service import protocol as P
from edgellama.service.job import Job

if TYPE_CHECKING:
    from edgellama.service.metrics import Metrics
    from edgellama.slots import Slot
    from edgellama.tool_stream import ToolStream


class SlotRequest:
    def __init__(self, job: Job, slot: Slot, n_prompt: int, n_cached: int, n_batch: int, t_start: float,
                 log_prompts: bool = False, tools: ToolStream | None = None) -> None:
        self.job, self.slot = job, slot
        self.n_cached = n_cached
        self.n_eval = n_prompt - n_cached
        self.n_batch = n_batch
        self.t_start = t_start  # time.perf_counter(), the clock of the request's Generation
        self.log_prompts = log_prompts
        self.gen: Generation | None = None  # set by the scheduler once the sampler is built
        self.probs: list[dict[str, Any]] = []  # log-probabilities not yet sent (logprobs / n_probs)
        self.tools = tools  # the reply's content and calls, when the request may call tools

    def send(self, text: str, token: int) -> None:
        """Generation's callback: a token's released text as a token event (or kept for the done event);
        asked for, the token's log-probabilities go with the next event that carries text."""
        job, req = self.job, self.job.req
        gen = self.gen
        if gen is not None and gen.n_predicted == 1 and "ttft_ms" not in job.stats:
            job.stats["ttft_ms"] = round((time.monotonic() - job.t_arrival) * 1000.0, 2)
        if token >= 0 and gen is not None and gen.last_probs is not None and gen.last_probs.id == token:
            from edgellama.logprobs import llama_entry

            self.probs.append(llama_entry(gen.tokenizer, gen.last_probs))
        if not text:
            return
        if self.log_prompts or not req.stream:
            job.output.append(text)
        deltas: list[dict[str, Any]] = []
        if self.tools is not None:
            text, deltas = self.tools.feed(text)
        if req.stream and (text or deltas):
            self._emit(text, deltas)

    def _emit(self, text: str, deltas: list[dict[str, Any]]) -> None:
        """A token event for text and a tool_calls event for call deltas (OpenAI's items), the first one
        sent carrying the log-probabilities not yet sent."""
        rid = self.job.req.id
        events: list[dict[str, Any]] = ([{"event": "token", "id": rid, "text": text}] if text else []) + (
            [{"event": "tool_calls", "id": rid, "tool_calls": deltas}] if deltas else [])
        if events and self.probs:
            events[0]["probs"], self.probs = self.probs, []
        for event in events:
            self.job.emit(event)

    def _tool_calls(self, done: dict[str, Any]) -> None:
        """The reply's end: the done event's tool_calls (the calls as streamed; deltas not yet streamed are
        sent first) and, not streamed, its content."""
        assert self.tools is not None
        end = self.tools.finish()
        if end.calls:
            done["tool_calls"] = [c.openai() for c in end.calls]
        if self.job.req.stream:
            if end.rest or end.deltas:
                self._emit(end.rest, end.deltas)
        else:
            done["content"] = end.content

    def step(self, logits: npt.NDArray[np.float32]) -> int | None:
        """The slot's next logits: the token to feed, or None once the request has ended (gen.stop_reason).
        Raises what sampling raises (GrammarDeadEnd, NonFiniteLogits)."""
        assert self.gen is not None
        return self.gen.step(logits)

    def done_event(self, reason: str | None, metrics: Metrics) -> dict[str, Any]:
        """The request's last event (reason: the scheduler's, e.g. cancelled or context; None: the one
        the generation ended with), metrics counted; what the generation held back is sent first."""
        job, req = self.job, self.job.req
        n_predicted = 0
        if self.gen is not None:
            tail = self.gen.finish(reason)
            reason = self.gen.stop_reason
            n_predicted = self.gen.n_predicted
            self.send(tail, -1)
        reason = reason or "length"
        if self.gen is not None:  # one timings clock: the Generation's, as LLM.generate reports it
            prompt_s, gen_s = self.gen.timings.prompt_ms / 1000.0, self.gen.timings.gen_ms / 1000.0
        else:  # refused before its generation began
            prompt_s, gen_s = time.perf_counter() - self.t_start, 0.0
        n_chunks = max(1, -(-self.n_eval // self.n_batch))
        metrics.prompt(self.n_eval, self.n_cached, prompt_s, n_chunks)
        metrics.predicted(n_predicted, gen_s)
        timings = {"queue_ms": job.stats["queue_ms"], "prompt_n": self.n_eval, "prompt_ms": round(prompt_s * 1000.0, 2),
                   "predicted_n": n_predicted, "predicted_ms": round(gen_s * 1000.0, 2),
                   "predicted_per_second": round(n_predicted / gen_s, 2) if gen_s > 0 else 0.0}
        job.stats.update(n_eval=self.n_eval, n_cached=self.n_cached, n_predicted=n_predicted,
                         prompt_ms=timings["prompt_ms"], gen_ms=timings["predicted_ms"])
        counts = {"tokens_evaluated": self.n_eval, "tokens_predicted": n_predicted,
                  "tokens_cached": self.n_cached, "timings": timings}
        if reason == "cancelled" or job.cancelled:
            if job.cancelled == "shutdown":
                return P.error_event(req.id, P.SHUTDOWN, "the server is shutting down")
            return {"event": "done", "id": req.id, "stop_reason": "cancelled", **counts}
        done: dict[str, Any] = {"event": "done", "id": req.id, "stop_reason": reason, **counts}
        if not req.stream:
            done["content"] = "".join(job.output)
        if self.tools is not None:
            self._tool_calls(done)
        if isinstance(req, P.Completion) and req.probs_wanted >= 0:
            done["probs"], self.probs = self.probs, []  # all of them, or (streamed) those no event carried
        return done
