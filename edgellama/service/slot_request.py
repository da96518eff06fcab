"""One request in a slot of the batched scheduler (--parallel > 1): sampling, streaming text with
stop strings, and the done event with its timings, token by token as the slots' steps deliver
logits. The same results as Scheduler._run gives through LLM.generate for one slot.

Knows nothing of sockets; the scheduler decides when a request starts, steps and ends.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from edgellama.sampling import Sampler, SamplerParams
from edgellama.tokenizers.tokenizer import StreamDecoder

if TYPE_CHECKING:
    from edgellama.service.scheduler import Job
    from edgellama.slots import Slot


class SlotRequest:
    def __init__(self, job: Job, slot: Slot, ids: list[int], n_cached: int, llm: Any, max_tokens: int,
                 t_start: float, log_prompts: bool = False) -> None:
        req = job.req
        self.job, self.slot, self.ids = job, slot, ids
        self.n_cached = n_cached
        self.n_eval = len(ids) - n_cached
        self.n_batch: int = llm.n_batch
        self.context_shift: bool = llm.context_shift
        self.n_ctx: int = llm.n_ctx
        self.n_predict = max_tokens if req.n_predict < 0 else min(req.n_predict, max_tokens)
        params = SamplerParams(temp=req.temperature, top_k=req.top_k, top_p=req.top_p, min_p=req.min_p,
                               repeat_penalty=req.repeat_penalty, repeat_last_n=req.repeat_last_n, seed=req.seed)
        self.sampler: Any = Sampler(params, llm.n_ctx)
        if req.constraint is not None:  # a grammar or JSON schema, compiled when the request arrived
            from edgellama.grammar import constrain

            self.sampler = constrain(self.sampler, req.constraint, llm.tokenizer)
        accept_prompt = getattr(self.sampler, "accept_prompt", self.sampler.accept)  # a grammar starts at the output
        for t in ids:
            accept_prompt(t)
        self.eot: set[int] = set(llm.tokenizer.eot_ids)
        self.dec = StreamDecoder(llm.tokenizer)
        self.t_start = t_start
        self.t_prompt_done = 0.0
        self.pending = ""  # text held back while it could still become a stop string
        self.n_predicted = 0
        self.log_prompts = log_prompts

    def on_logits(self, logits: npt.NDArray[np.float32]) -> tuple[int | None, str | None]:
        """The slot's next logits: (token to feed, None) to go on, or (None, stop reason) to end. Raises
        GrammarDeadEnd when the request's grammar needs a character no token has."""
        from edgellama.service.scheduler import _split_stop

        job, req = self.job, self.job.req
        if self.t_prompt_done == 0.0:
            self.t_prompt_done = time.monotonic()
        if job.cancelled:
            return None, "cancelled"
        if self.n_predicted >= self.n_predict:
            return None, "length"
        tok = self.sampler.sample(logits)
        self.sampler.accept(tok)
        self.n_predicted += 1
        if tok in self.eot:
            return None, "eos"
        if self.n_predicted == 1:
            job.stats["ttft_ms"] = round((time.monotonic() - job.t_arrival) * 1000.0, 2)
        self.pending += self.dec.push(tok)
        out, self.pending, hit = _split_stop(self.pending, req.stop, final=False)
        self._send(out)
        if hit:
            return None, "stop"
        if getattr(self.sampler, "finished", False):  # the grammar is complete: nothing more may follow
            return None, "eos"  # as Scheduler._run reports it
        if len(self.slot.tokens) >= self.n_ctx and not self.context_shift:  # as LLM.generate
            return None, "context"
        return tok, None

    def _send(self, out: str) -> None:
        if not out:
            return
        job, req = self.job, self.job.req
        if self.log_prompts or not req.stream:
            job.output.append(out)
        if req.stream:
            job.emit({"event": "token", "id": req.id, "text": out})

    def done_event(self, reason: str, metrics: Any) -> dict[str, Any]:
        """The request's last event (reason: eos, stop, length, context, cancelled), metrics counted."""
        from edgellama.service.scheduler import _split_stop

        job, req = self.job, self.job.req
        if reason in ("eos", "length", "context"):  # the decoder's tail, which may complete a stop string
            self.pending += self.dec.flush()
            out, self.pending, hit = _split_stop(self.pending, req.stop, final=True)
            self._send(out)
            reason = "stop" if hit else reason
        t_end = time.monotonic()
        if self.t_prompt_done == 0.0:
            self.t_prompt_done = t_end
        prompt_s, gen_s = self.t_prompt_done - self.t_start, t_end - self.t_prompt_done
        n_chunks = max(1, -(-self.n_eval // self.n_batch))
        metrics.prompt(self.n_eval, self.n_cached, prompt_s, n_chunks)
        metrics.predicted(self.n_predicted, gen_s)
        timings = {"queue_ms": job.stats["queue_ms"], "prompt_n": self.n_eval, "prompt_ms": round(prompt_s * 1000.0, 2),
                   "predicted_n": self.n_predicted, "predicted_ms": round(gen_s * 1000.0, 2),
                   "predicted_per_second": round(self.n_predicted / gen_s, 2) if gen_s > 0 else 0.0}
        job.stats.update(n_eval=self.n_eval, n_cached=self.n_cached, n_predicted=self.n_predicted,
                         prompt_ms=timings["prompt_ms"], gen_ms=timings["predicted_ms"])
        counts = {"tokens_evaluated": self.n_eval, "tokens_predicted": self.n_predicted,
                  "tokens_cached": self.n_cached, "timings": timings}
        if reason == "cancelled" or job.cancelled:
            if job.cancelled == "shutdown":
                from edgellama.service import protocol as P

                return P.error_event(req.id, P.SHUTDOWN, "the server is shutting down")
            return {"event": "done", "id": req.id, "stop_reason": "cancelled", **counts}
        done: dict[str, Any] = {"event": "done", "id": req.id, "stop_reason": reason, **counts}
        if not req.stream:
            done["content"] = "".join(job.output)
        return done

