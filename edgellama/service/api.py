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
    """A call that needs the model, made while it is not loaded (check `status == "ok"` first)."""


class ModelView(Protocol):
    """One of the service's models, as routes see it (Service.model)."""

    @property
    def name(self) -> str:
        """Its name in requests and answers (one model: its file's name)."""
        ...

    @property
    def status(self) -> str:
        """"ok" while loaded and serving; else its state: loading, unloaded or failed."""
        ...

    @property
    def reason(self) -> str:
        """Why it failed ("" otherwise)."""
        ...

    @property
    def model_path(self) -> str:
        """The model as configured (/props' model_path), "" if none named."""
        ...

    @property
    def embedding(self) -> bool:
        """The model answers embeddings requests (serve --embedding, or its [models.NAME] table's)."""
        ...

    def pooling(self) -> str:
        """How the loaded model pools embeddings (none, mean, cls, last, rank); NotReady unless loaded."""
        ...

    def rerank_prompt(self, query: str, document: str) -> list[int]:
        """The tokens a reranker scores for query and document (llama-server's input); NotReady unless
        the model is loaded."""
        ...

    def model_facts(self) -> ModelFacts | None:
        """The model's facts; None until it was loaded once."""
        ...

    def tokenizer(self) -> Tokenizer:
        """The loaded model's tokenizer; NotReady unless it is loaded."""
        ...

    def chat_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """The text chat messages are evaluated as: the model's chat template over them (and OpenAI's tools,
        as a chat request with tools renders them), with its --system-prompt first unless they hold a
        system message. NotReady unless the model is loaded;
        protocol.ProtocolError when the template refuses them."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """status, slots, slots_busy, queue, queue_max, n_ctx, kv_cache_tokens."""
        ...

    def slot_requests(self) -> list[P.Completion | None]:
        """The request each slot is running, None for an idle slot."""
        ...

    def lora_adapters(self) -> list[LoraInfo]:
        """The adapters loaded at start, in number order; [] unless the model is loaded."""
        ...

    def set_lora_defaults(self, lora: list[tuple[int, float]]) -> None:
        """Later requests without a `lora` field run the listed adapters at these scales, the others at 0;
        protocol.ProtocolError for an unknown adapter id (nothing changes then); NotReady unless loaded."""
        ...


@dataclass(frozen=True)
class ModelInfo:
    """One configured model as /v1/models and /models list it."""

    name: str
    path: str
    state: str  # loaded, loading, unloaded, failed
    reason: str  # why it failed
    aliases: list[str]  # the aliases that may route to it
    n_ctx: int  # the context it runs with (0: unknown, its file could not be read)
    plan_bytes: int  # its memory plan
    loads: int  # times it was loaded


class Service(Protocol):
    """The service as its connections and routes see it."""

    @property
    def status(self) -> str:
        """"loading" until the service serves (one model: until it is loaded), then "ok"."""
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
    def several(self) -> bool:
        """The service was configured with several models (names route; unknown names are refused)."""
        ...

    @property
    def max_tokens(self) -> int:
        """The server's bound on the tokens one request may generate."""
        ...

    def model(self, name: str | None) -> ModelView:
        """The model a name means (None: the default; an alias: its first model); protocol.ProtocolError
        (not_found, listing the names) for an unknown one. One model: every name means it."""
        ...

    def choose(self, name: str | None) -> str:
        """The model a request for name goes to: an alias of several picks one by weight (and counts it)."""
        ...

    async def loaded(self, name: str | None) -> ModelView:
        """The model, loaded (a load starts if it is not, and this waits for it); protocol.ProtocolError
        if it fails (unavailable) or is unknown. One model: as model(name), without waiting."""
        ...

    def model_list(self) -> list[ModelInfo]:
        """Every configured model with its state, in configuration order."""
        ...

    def load_model(self, name: str) -> None:
        """Loads the model (again, if it failed) without a request; ProtocolError for an unknown name."""
        ...

    def unload_model(self, name: str) -> bool:
        """Unloads the model if nothing runs or waits on it (True), else False; ProtocolError if unknown."""
        ...

    def metrics_text(self) -> str:
        """The Prometheus text of /metrics."""
        ...

    def submit(self, conn: Client, req: P.Completion | P.Embedding) -> P.ProtocolError | None:
        """Queues req for conn (its events reach conn.send); the refusal (busy, shutdown, unknown or failed
        model), if refused."""
        ...

    def cancel(self, conn: Client, req_id: str | int) -> None:
        """Cancels conn's request req_id if it is in flight (protocol v1's cancel); else nothing."""
        ...

    def connection_opened(self, conn: Client) -> None: ...

    def connection_gone(self, conn: Client) -> None:
        """conn closed: what it has in flight is cancelled."""
        ...
