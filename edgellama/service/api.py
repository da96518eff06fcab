"""What the service's connections and HTTP routes may ask of it: one narrow interface (`Service`, which
`server.Server` implements), the `Client` side the server answers, and small plain data types.

The HTTP front end (service/http/) imports this module, never server.py, scheduler.py or the LLM: a
route sees the model through these facts and calls, not through the objects that hold it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from edgellama.service import protocol as P


class Client(Protocol):
    """A client the server answers: protocol v1's Connection, an HttpConnection or a SerialPort."""

    inflight: dict[str | int, Any]  # request id -> the server's job for it
    eof: bool  # the client half-closed: close it once the last request in flight is answered

    @property
    def port_name(self) -> str | None:
        """The serial port this client is (its name in logs and metrics), None for a socket client."""
        ...

    def send(self, event: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


class Tokenizer(Protocol):
    """The loaded model's tokenizer, as much of it as /tokenize and /detokenize use."""

    @property
    def n_vocab(self) -> int: ...
    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]: ...
    def token_bytes(self, tid: int) -> bytes: ...
    def decode(self, ids: Sequence[int], strip_space_prefix: bool | None = None) -> str: ...


@dataclass(frozen=True)
class ModelFacts:
    """The loaded model, as /v1/models and /props describe it."""

    n_ctx: int  # the context this service runs with
    n_vocab: int
    n_embd: int | None
    n_ctx_train: Any  # the file's <arch>.context_length as stored (None when absent)
    size: int  # bytes of the model file
    chat_template: str  # tokenizer.chat_template, "" when the file has none


@dataclass(frozen=True)
class LoraInfo:
    """One LoRA adapter loaded at start, with the scale requests without a `lora` field run it at."""

    path: str
    scale: float
    task_name: str
    prompt_prefix: str


class NotReady(Exception):
    """A call that needs the model, made while it loads (check `status == "ok"` first)."""


class Service(Protocol):
    """The service as its connections and routes see it."""

    @property
    def status(self) -> str:
        """"loading" until the model is loaded and serving, then "ok"."""
        ...

    @property
    def stopping(self) -> bool:
        """Shutdown has begun."""
        ...

    @property
    def started(self) -> float:
        """time.time() when the service started."""
        ...

    @property
    def model_path(self) -> str:
        """The model as configured (/props' model_path; its file name is the model's id), "" if none named."""
        ...

    @property
    def max_tokens(self) -> int:
        """The server's bound on the tokens one request may generate."""
        ...

    @property
    def embedding(self) -> bool:
        """The service answers embeddings requests (serve --embedding)."""
        ...

    def pooling(self) -> str:
        """How the loaded model pools embeddings (none, mean, cls, last); NotReady while it loads."""
        ...

    def rerank_prompt(self, query: str, document: str) -> list[int]:
        """The tokens a reranker scores for query and document (llama-server's input); NotReady while
        the model loads."""
        ...

    def model_facts(self) -> ModelFacts | None:
        """The loaded model's facts; None until the model is loaded."""
        ...

    def tokenizer(self) -> Tokenizer:
        """The loaded model's tokenizer; NotReady while it loads."""
        ...

    def chat_prompt(self, messages: list[dict[str, Any]]) -> str:
        """The text chat messages are evaluated as: the model's chat template over them, with the server's
        --system-prompt first unless they hold a system message. NotReady while the model loads;
        protocol.ProtocolError when the template refuses them."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """status, slots, slots_busy, queue, queue_max, n_ctx, kv_cache_tokens."""
        ...

    def slot_requests(self) -> list[P.Completion | None]:
        """The request each slot is running, None for an idle slot."""
        ...

    def lora_adapters(self) -> list[LoraInfo]:
        """The adapters loaded at start, in number order; [] while the model loads."""
        ...

    def set_lora_defaults(self, lora: list[tuple[int, float]]) -> None:
        """Later requests without a `lora` field run the listed adapters at these scales, the others at 0;
        protocol.ProtocolError for an unknown adapter id (nothing changes then)."""
        ...

    def metrics_text(self) -> str:
        """The Prometheus text of /metrics."""
        ...

    def submit(self, conn: Client, req: P.Completion | P.Embedding) -> P.ProtocolError | None:
        """Queues req for conn (its events reach conn.send); the refusal (busy, shutdown), if refused."""
        ...

    def connection_opened(self, conn: Client) -> None: ...

    def connection_gone(self, conn: Client) -> None:
        """conn closed: what it has in flight is cancelled."""
        ...
