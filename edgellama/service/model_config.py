"""Which models a service holds, read from its flags: `-m NAME=FILE` (repeatable; FILE may be a pulled
name), `--models-dir DIR`, the --config file's `[models.NAME]` tables (per-model flags: ctx-size, parallel,
cache-type, numerics, lora, embedding, system-prompt, sha256, keep-alive, ...) and its `[aliases]` (a name
for one model, or for several with weights: `chat = {v1 = 90, v2 = 10}`), and `--default-model`.

A bare `-m FILE`, or no -m at all, is one model named after its file, served exactly as before.
No file is opened here: the model set (models.py) plans and loads them.
"""

from __future__ import annotations

import argparse
import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgellama.load_options import LoadOptions, model_path
from edgellama.service import protocol as P

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+-]{0,127}")
HEX64 = re.compile(r"[0-9a-fA-F]{64}")
# the serve flags a [models.NAME] table may set (the others are the service's, not a model's)
PER_MODEL = ("model", "ctx_size", "batch_size", "threads", "parallel", "cache_type", "numerics", "lora", "embedding",
             "pooling", "reranking", "system_prompt", "keep", "no_context_shift", "keep_alive")
SPLIT_PIECE = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<n>\d{5})\.gguf$")


@dataclass
class ModelSpec:
    name: str
    opts: LoadOptions  # what this model loads with: the service's flags, its table's over them, the file's defaults
    sha256: str | list[str] | None = None  # the file's (or a split model's pieces merged); checked before each load
    keep_alive: float | None = None  # None: the service's --keep-alive
    system_prompt: str | None = None  # the text of its --system-prompt file
    ctx_given: bool = True  # its context was given for it (-m FILE alone, or its table's ctx-size), not service-wide


@dataclass
class ModelsConfig:
    models: dict[str, ModelSpec]  # in configuration order
    aliases: dict[str, list[tuple[str, float]]] = field(default_factory=dict)  # alias -> (model, weight)
    default: str = ""
    several: bool = False  # False: one model from -m FILE (or the default model), as before this config existed
    models_max: int = 0  # 0: no limit on how many are loaded at once (the RAM budget still is one)
    keep_alive: float = -1.0  # the default: loaded until evicted

    def names(self) -> list[str]:
        return [*self.models, *self.aliases]


def check_name(name: str, what: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise ValueError(f"{what} {name!r}: a model name is letters, digits and . _ : + - (at most 128, "
                         "starting with a letter or digit)")
    return name


def split_entry(entry: str) -> tuple[str | None, str]:
    """-m's value: NAME=FILE, or a plain FILE (an existing path with '=' in it stays a path)."""
    name, sep, rest = entry.partition("=")
    if sep and rest and NAME_RE.fullmatch(name) and not Path(entry).exists():
        return name, rest
    return None, entry


def name_of_file(path: Path) -> str:
    """A model's name from its file: the file name without .gguf; a split model by its first piece's stem."""
    m = SPLIT_PIECE.match(path.name)
    stem = m.group("stem") if m else (path.name[:-5] if path.name.lower().endswith(".gguf") else path.name)
    return re.sub(r"[^A-Za-z0-9._:+-]", "_", stem)[:128] or "model"


def scan_dir(folder: str) -> list[tuple[str, str]]:
    """--models-dir: every .gguf file a model (split models once, by their first piece); a vision
    projector (mmproj*) is not a model of its own."""
    d = Path(folder)
    if not d.is_dir():
        raise ValueError(f"--models-dir {folder}: not a directory")
    out: list[tuple[str, str]] = []
    for f in sorted(d.iterdir()):
        if not f.name.lower().endswith(".gguf") or f.name.lower().startswith("mmproj") or not f.is_file():
            continue
        m = SPLIT_PIECE.match(f.name)
        if m and int(m.group("no")) != 1:
            continue
        out.append((name_of_file(f), str(f)))
    if not out:
        raise ValueError(f"--models-dir {folder}: no .gguf files")
    return out


def _table_value(key: str, v: Any, actions: dict[str, argparse.Action], where: str) -> tuple[str, Any]:
    from edgellama.service import config

    dest = key.replace("-", "_")
    if dest == "sha256":
        items = v if isinstance(v, list) else [v]
        if not items or not all(isinstance(x, str) and HEX64.fullmatch(x) for x in items):
            raise ValueError(f"{where}: sha256 must be 64 hex digits (a list of them: one per piece of a split "
                             "model)")
        return "sha256", v.lower() if isinstance(v, str) else [x.lower() for x in v]
    a = actions.get(dest)
    if a is None or a.dest not in PER_MODEL:
        raise ValueError(f"{where}: unknown key {key!r} (a model's keys: sha256, "
                         f"{', '.join(k.replace('_', '-') for k in PER_MODEL)})")
    if a.dest == "lora":  # a file, or a list of files (at scale 1) or of [file, scale] pairs
        items = v if isinstance(v, list) else [v]
        out = []
        for it in items:
            if isinstance(it, str):
                out.append((Path(it), 1.0))
            elif (isinstance(it, list) and len(it) == 2 and isinstance(it[0], str)
                  and isinstance(it[1], (int, float)) and not isinstance(it[1], bool)):
                out.append((Path(it[0]), float(it[1])))
            else:
                raise ValueError(f"{where}: lora must be a file, or a list of files or [file, scale] pairs")
        return "lora", out
    return a.dest, config._value(key, a, v, Path(where))


def _apply_table(spec_args: argparse.Namespace, table: dict[str, Any], actions: dict[str, argparse.Action],
                 where: str) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    for key, v in table.items():
        dest, value = _table_value(key, v, actions, where)
        if dest == "sha256":
            extra["sha256"] = value
        elif dest == "keep_alive":
            extra["keep_alive"] = value
        elif dest == "model":
            spec_args.model = value[0] if isinstance(value, list) else value
        else:
            setattr(spec_args, dest, value)
    return extra


def models_config(args: argparse.Namespace) -> ModelsConfig:
    """The models of `serve` (and `info --plan` on the same flags) from its merged flags; ValueError naming
    the flag or table at fault."""
    from edgellama.service import config

    entries = list(args.model or []) if isinstance(args.model, list) else ([args.model] if args.model else [])
    tables: dict[str, Any] = getattr(args, "model_tables", None) or {}
    alias_tables: dict[str, Any] = getattr(args, "alias_tables", None) or {}
    parsed = [split_entry(e) for e in entries]
    several = bool(args.models_dir or tables or args.alias or alias_tables or args.default_model
                   or any(n is not None for n, _ in parsed) or len(parsed) > 1)
    keep = P.keep_alive(args.keep_alive, what="--keep-alive")
    default_keep = -1.0 if keep is None else keep
    if args.models_max < 0:
        raise ValueError("--models-max must be >= 0 (0: no limit but the RAM budget)")
    if not several:
        one = LoadOptions.from_args(args)
        one.model = parsed[0][1] if parsed else None
        name = model_path(one).name
        return ModelsConfig({name: ModelSpec(name, one)}, default=name, keep_alive=default_keep,
                            models_max=args.models_max)
    sources: dict[str, str | None] = {}

    def add(name: str, source: str | None, what: str) -> None:
        check_name(name, what)
        if name in sources:
            raise ValueError(f"{what}: model {name!r} is named twice")
        sources[name] = source

    for given, source in parsed:
        add(given or name_of_file(Path(source)), source, f"-m {source}" if given is None else f"-m {given}")
    if args.models_dir:
        for found, source in scan_dir(args.models_dir):
            if found not in sources:  # a model given by name keeps its own file
                sources[found] = source
    for named in tables:
        if named not in sources:
            add(named, None, f"[models.{named}]")
    actions = config._key_actions(args._actions)
    specs: dict[str, ModelSpec] = {}
    for name, src in sources.items():
        spec_args = copy.copy(args)
        spec_args.model = src
        spec_args.mem_budget = None  # the service's budget is for all of them; each model's context is its own
        table = tables.get(name, {})
        if not isinstance(table, dict):
            raise ValueError(f"[models.{name}] must be a table")  # noqa: TRY004 - the CLI reports ValueError
        extra = _apply_table(spec_args, table, actions, f"{getattr(args, 'config', '') or 'config'}: [models.{name}]")
        if not spec_args.model:
            raise ValueError(f"[models.{name}] needs a model = \"FILE\" (or a pulled name)")
        specs[name] = ModelSpec(name, LoadOptions.from_args(spec_args), sha256=extra.get("sha256"),
                                keep_alive=P.keep_alive(extra["keep_alive"], what=f"[models.{name}] keep-alive")
                                if "keep_alive" in extra else None,
                                ctx_given=any(k.replace("-", "_") == "ctx_size" for k in table))
    aliases = _aliases(args, alias_tables, specs)
    default = args.default_model or next(iter(specs))
    if default not in specs and default not in aliases:
        raise ValueError(f"--default-model {default}: no such model or alias (models: {', '.join(specs)})")
    return ModelsConfig(specs, aliases, default, True, args.models_max, default_keep)


def _aliases(args: argparse.Namespace, tables: dict[str, Any],
             specs: dict[str, ModelSpec]) -> dict[str, list[tuple[str, float]]]:
    raw: dict[str, Any] = dict(tables)
    for entry in args.alias or []:  # --alias NAME=MODEL[:WEIGHT],MODEL[:WEIGHT]...
        name, sep, rest = entry.partition("=")
        if not sep or not rest:
            raise ValueError(f"--alias {entry}: want NAME=MODEL or NAME=MODEL:WEIGHT,MODEL:WEIGHT")
        targets: dict[str, Any] = {}
        for part in rest.split(","):
            model, sep, weight = part.strip().rpartition(":")
            if not sep or model not in specs:  # model names may hold ':' (llama3:8b): a weight follows a model
                model, weight = part.strip(), "1"
            try:
                targets[model] = float(weight)
            except ValueError:
                raise ValueError(f"--alias {entry}: weight {weight!r} is not a number") from None
        raw[name] = targets
    out: dict[str, list[tuple[str, float]]] = {}
    for name, v in raw.items():
        what = f"alias {name!r}"
        check_name(name, what)
        if name in specs:
            raise ValueError(f"{what} is also a model's name")
        targets = {v: 1.0} if isinstance(v, str) else v
        if not isinstance(targets, dict) or not targets:
            raise ValueError(f"{what} must name a model, or models with weights ({{v1 = 90, v2 = 10}})")
        pairs: list[tuple[str, float]] = []
        for model, weight in targets.items():
            if model not in specs:
                raise ValueError(f"{what}: no model {model!r} (models: {', '.join(specs)})")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < 1e9:
                raise ValueError(f"{what}: the weight of {model} must be a positive number")
            pairs.append((model, float(weight)))
        out[name] = pairs
    return out
