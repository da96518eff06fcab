"""One model's load settings, whichever door gives them: `LLM(...)` arguments, a command's flags (-m, -c, -t, -b,
--cache-type, --numerics, --lora, --embedding, ...) or a service's `[models.NAME]` table. One type, one check of
its ranges, one way to find the file and load it, and the defaults the file itself implies (an encoder serves
embeddings, within its positions). Knows no flags parsing and no service: values in, an LLM out.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from edgellama.gguf.limits import INT32_MAX

MAX_CTX = 1 << 24  # memplan.MAX_CTX, repeated so that `info` need not import numpy to check a value
MAX_THREADS = 64


@dataclass
class LoadOptions:
    """Named as the command-line flags' destinations, so a command's parsed flags convert field by field."""

    model: str | None = None  # a GGUF file or a catalogue name; None: the bundled default model
    ctx_size: int = 0  # 0: the model's default (4096, or its training context under a budget)
    batch_size: int = 512
    threads: int = 0  # 0: the CPUs available
    cache_type: str = "f16"
    mem_budget: str | None = None  # "300M", "1.5G"
    keep: int = 0
    no_context_shift: bool = False
    numerics: str = "native"
    chat_template: str | None = None
    seed: int | None = None
    parallel: int | None = None  # sequences: None, 1 (4 for embeddings)
    lora: list[tuple[Path, float]] = field(default_factory=list)
    embedding: bool = False
    pooling: str | None = None
    reranking: bool = False
    system_prompt: str | None = None  # a file holding the service's system prompt for this model

    @classmethod
    def from_args(cls, args: Any) -> LoadOptions:
        """The settings among args' attributes (a command's parsed flags); the others keep their defaults."""
        values = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
        if "lora" in values:
            values["lora"] = lora_list(values["lora"])
        if isinstance(values.get("model"), list):  # serve's repeatable -m, one entry left
            values["model"] = values["model"][0] if values["model"] else None
        return cls(**values)


def lora_list(value: Any) -> list[tuple[Path, float]]:
    """--lora's value as (file, scale) pairs; a config file's `lora = "FILE"` is one adapter at scale 1."""
    if isinstance(value, (str, Path)):
        return [(Path(value), 1.0)]
    return list(value or [])


def model_path(opts: Any) -> Path:
    """The file opts.model names (a path, or a pulled catalogue name), or the default model's."""
    if opts.model:
        from edgellama.registry import MODELS, known, resolve

        path = Path(opts.model)
        if not path.exists() and known(opts.model):
            return resolve(opts.model)
        if not path.exists():
            raise FileNotFoundError(f"model file not found: {path} (or a name: {', '.join(MODELS)})")
        if not path.is_file():
            raise ValueError(f"model path is not a file: {path}")
        return path
    from edgellama.default_model import default_model_path

    return default_model_path()


def check_range(flag: str, value: int, lo: int, hi: int) -> None:
    """Refuses a value outside lo..hi, naming the flag (before it reaches arithmetic or C)."""
    if not lo <= value <= hi:
        raise ValueError(f"{flag} {value} is out of range ({lo}..{hi})")


def check_model_args(opts: Any) -> None:
    """The settings within what the engine takes (threads may be a list: bench's)."""
    check_range("-c/--ctx-size", opts.ctx_size, 0, MAX_CTX)
    for t in opts.threads if isinstance(opts.threads, list) else [opts.threads]:
        check_range("-t/--threads", t, 0, MAX_THREADS)
    check_range("-b/--batch-size", opts.batch_size, 1, INT32_MAX)
    check_range("--keep", getattr(opts, "keep", 0), 0, INT32_MAX)


def load(opts: Any, file: Any = None) -> Any:  # -> LLM (import kept lazy: `info` must start fast)
    """The model of these settings; file: the model file already open (it becomes the LLM's)."""
    from edgellama.llm import LLM
    from edgellama.memplan import parse_size

    check_model_args(opts)
    budget = parse_size(opts.mem_budget) if opts.mem_budget else None
    return LLM(file if file is not None else model_path(opts), n_ctx=opts.ctx_size or None, n_batch=opts.batch_size,
               n_threads=opts.threads or None, kv_type=opts.cache_type, mem_budget=budget, n_keep=opts.keep,
               context_shift=not opts.no_context_shift, numerics=opts.numerics,
               chat_format=getattr(opts, "chat_template", None), seed=getattr(opts, "seed", None),
               n_seq=getattr(opts, "parallel", None), loras=lora_list(getattr(opts, "lora", [])),
               embedding=getattr(opts, "embedding", False), pooling=getattr(opts, "pooling", None))


def apply_file_defaults(opts: LoadOptions, ctx_given: bool = True) -> None:
    """What the file implies, read from its header (no weights): an encoder (BERT) serves embeddings, and
    a context not given for this model (ctx_given False: a service-wide -c) stays within an encoder's
    absolute positions. An unreadable file is left as it is: its load fails later, naming why."""
    from edgellama.gguf.split import open_model_file
    from edgellama.wiring import build_desc

    try:
        with open_model_file(model_path(opts)) as f:
            hp, desc = build_desc(f)
    except (OSError, ValueError):
        return
    if not desc.non_causal:
        return
    opts.embedding = True
    train = hp.n_ctx_train or 0
    if not ctx_given and train and opts.ctx_size > train:
        opts.ctx_size = train
