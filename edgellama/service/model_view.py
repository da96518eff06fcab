"""One of the service's models as routes see it (api.ModelView): what its host knows (state, plan, facts
of its last load) and, while it is loaded, what its LLM answers (tokenizer, chat template, pooling)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from edgellama.service import protocol as P
from edgellama.service.api import LoraInfo, ModelFacts, NotReady, Tokenizer
from edgellama.service.models import ModelHost

if TYPE_CHECKING:
    from edgellama.llm import LLM


class Model:
    """One of the service's models as routes see it (api.ModelView): its host's facts and its loaded LLM."""

    def __init__(self, host: ModelHost) -> None:
        self.host = host

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def status(self) -> str:
        return "ok" if self.host.state == "loaded" else self.host.state

    @property
    def reason(self) -> str:
        return self.host.reason

    @property
    def model_path(self) -> str:
        return str(self.host.spec.opts.model or (self.host.paths[0] if self.host.paths else ""))

    @property
    def embedding(self) -> bool:
        return bool(self.host.spec.opts.embedding)

    def _llm(self) -> LLM:
        s = self.host.sched
        llm = s.llm if s is not None else None
        if llm is None or s is None or s.status != "ok":
            raise NotReady(f"model {self.name} is {self.host.state}")
        return llm

    def model_facts(self) -> ModelFacts | None:
        s = self.host.sched
        llm = s.llm if s is not None else None
        if llm is not None and (self.host.facts is None or self.host.facts[0] != id(llm)):
            md = llm.file.metadata  # facts of one loaded model do not change: made once per load
            template = md.get("tokenizer.chat_template")
            self.host.facts = (id(llm), ModelFacts(
                n_ctx=llm.n_ctx, n_vocab=llm.n_vocab,
                n_ctx_train=md.get(f"{md.get('general.architecture')}.context_length"),
                n_embd=getattr(llm.desc, "n_embd", None), size=sum(os.path.getsize(p) for p in self.host.paths),
                chat_template=template if isinstance(template, str) else ""))
        return self.host.facts[1] if self.host.facts is not None else None

    def tokenizer(self) -> Tokenizer:
        return self._llm().tokenizer

    def chat_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        from edgellama.service.scheduler import render_chat

        # the --system-prompt added as the scheduler adds it to a chat request
        return render_chat(self._llm(), messages, self.host.engine.system_prompt, tools).text

    def snapshot(self) -> dict[str, Any]:
        s = self.host.sched
        if s is not None:
            snap = s.snapshot()
            snap["status"] = "ok" if self.host.state == "loaded" else self.host.state
        else:
            snap = {"status": self.host.state, "slots": max(1, self.host.engine.parallel), "slots_busy": 0,
                    "queue": 0, "queue_max": self.host.engine.queue, "n_ctx": 0, "kv_cache_tokens": 0}
        if not snap["n_ctx"] and self.host.plan is not None:
            snap["n_ctx"] = self.host.plan.n_ctx  # what it will run with once loaded
        return snap

    def pooling(self) -> str:
        return str(self._llm().pooling)

    def rerank_prompt(self, query: str, document: str) -> list[int]:
        from edgellama.embedding import rerank_tokens

        return rerank_tokens(self._llm().tokenizer, query, document)

    def slot_requests(self) -> list[P.Completion | None]:
        s = self.host.sched
        if s is None:
            return []
        return [job.req if job is not None and isinstance(job.req, P.Completion) else None for job in s.slot_jobs()]

    def lora_adapters(self) -> list[LoraInfo]:
        s = self.host.sched
        if s is None:
            return []
        return [LoraInfo(path=str(ad.path), scale=scale, task_name=ad.task_name, prompt_prefix=ad.prompt_prefix)
                for ad, scale in s.lora_adapters()]

    def set_lora_defaults(self, lora: list[tuple[int, float]]) -> None:
        s = self.host.sched
        if s is None or s.status != "ok":
            raise NotReady(f"model {self.name} is {self.host.state}")
        s.set_lora_defaults(lora)
