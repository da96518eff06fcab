"""`edgellama info MODEL`: what a GGUF file holds (architecture, metadata, tensors, quant types), as text or JSON.

It reads only the header through the mmap-based reader, so it never pages in tensor data; the one
exception is an explicit checksum (--sha256 or a MODEL.sha256 sidecar), which must hash the whole file.
Exit status: 0 fine, 1 the model is bad (invalid GGUF or sha256 mismatch), 2 no model to read
(missing path, default model not installed, unreadable sidecar) or a usage error.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from edgellama.cli.common import NUMERICS, add_lora_args
from edgellama.gguf.ggml_types import type_name
from edgellama.gguf.reader import GGUFError, GGUFValueType, ValueTypes
from edgellama.gguf.split import ModelFile, SplitGGUF, open_model_file

SUMMARY_ITEMS = 8  # arrays longer than this are summarized unless --full
SUMMARY_HEAD = 3
LONG_STRING = 100  # characters shown of a long string (chat templates) unless --full
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")

EXIT_OK, EXIT_BAD_MODEL, EXIT_NO_MODEL = 0, 1, 2


class _Fail(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "info",
        help="show what a GGUF model holds (like llama.cpp's gguf-dump)",
        description="Show a GGUF model's architecture, hyperparameters, metadata, tensor types and sizes. "
        "Reads only the file header, unless a checksum is verified.",
    )
    p.add_argument("model", nargs="?", type=Path, help="GGUF file (default: the installed default model)")
    p.add_argument("-m", "--model", dest="model_opt", type=Path, metavar="MODEL",
                   help="the same as MODEL, as the other commands take it (also a name from `edgellama list`)")
    p.add_argument("--tensors", action="store_true", help="also print the tensor table")
    p.add_argument("--full", action="store_true", help="print long arrays and strings whole")
    p.add_argument("--json", action="store_true", help="print everything as one JSON object")
    p.add_argument(
        "--sha256",
        metavar="HEX",
        help="verify the file against this sha256 (default: MODEL.sha256 beside the file, if present)",
    )
    p.add_argument("--system", action="store_true", help="also print the kernel ISA and CPU features")
    g = p.add_argument_group("memory plan (--plan: what loading would take, without loading)")
    g.add_argument("--plan", action="store_true", help="print the RAM plan: weights, KV cache, scratch, overhead")
    g.add_argument("-c", "--ctx-size", type=int, default=0, help="context (default: the largest within the budget)")
    g.add_argument("-b", "--batch-size", type=int, default=512)
    g.add_argument("-t", "--threads", type=int, default=0)
    g.add_argument("--cache-type", choices=("f16", "q8_0", "f32"), default="f16")
    g.add_argument("--mem-budget", metavar="SIZE", help="e.g. 300M, 1.5G")
    g.add_argument("--numerics", choices=NUMERICS, default="native",
                   help="llamacpp: the scratch of llama.cpp's float order too")
    add_lora_args(g)
    g.add_argument("--parallel", type=int, default=1,
                   help="slots of `serve --parallel N`: N KV caches of the context each")
    p.set_defaults(func=run, handler=run)  # edgellama.cli dispatches on args.handler
    return p


# --- value formatting -----------------------------------------------------------------------------


def printable(text: str) -> str:
    """text with every character a terminal would act on (control characters, escape sequences'
    ESC, newlines, bidirectional overrides, other non-printables) shown as a backslash escape, so a
    name from a file can neither fake extra lines nor drive the terminal."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable():
            out.append(ch)
        else:
            c = ord(ch)
            out.append(f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}")
    return "".join(out)


def _type_label(types: ValueTypes) -> str:
    if types[0] != GGUFValueType.ARRAY:
        return types[0].name.lower()
    return "[" * (len(types) - 1) + types[-1].name.lower() + "]" * (len(types) - 1)


def _scalar_text(v: Any, vtype: GGUFValueType) -> str:
    if vtype == GGUFValueType.FLOAT32:
        return str(np.float32(v))  # the shortest text that is this float32, not its double expansion
    if isinstance(v, str):
        return printable(json.dumps(v, ensure_ascii=False))  # quoted, newlines escaped: one line per key
    return str(v)


def _items_text(items: list[Any], vtype: GGUFValueType) -> str:
    if vtype == GGUFValueType.STRING:
        return ", ".join(repr(s) for s in items)
    if vtype == GGUFValueType.FLOAT32:
        return ", ".join(str(np.float32(x)) for x in items)
    return ", ".join(str(x) for x in items)


def value_text(value: Any, types: ValueTypes, full: bool) -> str:
    """One-line rendering of a metadata value; long arrays and strings summarized unless full."""
    if types[0] != GGUFValueType.ARRAY:
        if isinstance(value, str) and not full and len(value) > LONG_STRING:
            return _scalar_text(value[:LONG_STRING], types[0]) + f" ... ({len(value)} chars)"
        return _scalar_text(value, types[0])
    n = len(value)
    if len(types) > 2 or (n and isinstance(value[0], (list, np.ndarray))):  # nested: show the structure
        inner = [value_text(v, types[1:], full) for v in (value if full else value[:SUMMARY_HEAD])]
        more = ", ..." if not full and n > SUMMARY_HEAD else ""
        return f"[{n} x {_type_label(types[1:])}] [{', '.join(inner)}{more}]"
    items = value.tolist() if isinstance(value, np.ndarray) else list(value)
    if full or n <= SUMMARY_ITEMS:
        return f"[{_items_text(items, types[1])}]"
    return f"[{n} x {types[1].name.lower()}] [{_items_text(items[:SUMMARY_HEAD], types[1])}, ...]"


def _json_safe(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN/Infinity
    if isinstance(v, np.ndarray):
        return _json_safe(v.tolist())
    if isinstance(v, list):
        return [_json_safe(x) for x in v]
    return v


def value_json(value: Any, types: ValueTypes, full: bool) -> dict[str, Any]:
    d: dict[str, Any] = {"type": types[0].name.lower()}
    if types[0] != GGUFValueType.ARRAY:
        d["value"] = _json_safe(value)
        return d
    d["element_type"] = _type_label(types[1:])
    d["length"] = len(value)
    if full or len(value) <= SUMMARY_ITEMS:
        d["value"] = _json_safe(value)
    else:
        d["head"] = _json_safe(value[:SUMMARY_HEAD])
    return d


# --- report --------------------------------------------------------------------------------------


def type_table(f: ModelFile) -> list[dict[str, Any]]:
    """Tensors, elements and bytes per ggml type, biggest first."""
    rows: dict[int, dict[str, Any]] = {}
    for t in f.tensors:
        r = rows.setdefault(t.ggml_type, {"type": type_name(t.ggml_type), "tensors": 0, "elements": 0, "bytes": 0})
        r["tensors"] += 1
        r["elements"] += t.n_elements
        r["bytes"] += t.n_bytes
    return sorted(rows.values(), key=lambda r: (-r["bytes"], r["type"]))


def hyperparameters(f: ModelFile) -> dict[str, str]:
    arch = f.architecture
    if not arch:
        return {}
    prefix = arch + "."
    return {k[len(prefix) :]: k for k in f.metadata if k.startswith(prefix)}


def report_json(f: ModelFile, full: bool, sha: dict[str, Any] | None) -> dict[str, Any]:
    piece = {t.name: i + 1 for i, p in enumerate(f.pieces) for t in p.tensors} if isinstance(f, SplitGGUF) else {}
    return {
        "path": str(f.path),
        "file_size": f.file_size,
        "version": f.version,
        "alignment": f.alignment,
        "data_offset": f.data_offset,
        "metadata_count": len(f.metadata),
        "tensor_count": len(f.tensors),
        "architecture": f.architecture,
        "support": dict(zip(("supported", "detail"), _support(f))),
        "hyperparameters": {short: _json_safe(f.metadata[k]) for short, k in hyperparameters(f).items()},
        "metadata": {k: value_json(v, f.metadata_types[k], full) for k, v in f.metadata.items()},
        "types": type_table(f),
        "tensors": [
            {"name": t.name, "shape": list(t.shape), "type": t.type_name, "offset": t.offset, "n_bytes": t.n_bytes,
             **({"piece": piece[t.name]} if piece else {})}  # a split model: offsets are in that piece (1-based)
            for t in f.tensors
        ],
        "pieces": _pieces(f),
        "sha256": sha,
    }


def _support(f: ModelFile) -> tuple[bool, str]:
    from edgellama.wiring import support

    return support(f)


def _pieces(f: ModelFile) -> list[dict[str, Any]] | None:
    if not isinstance(f, SplitGGUF):
        return None
    return [{"path": str(path), "file_size": p.file_size, "tensors": len(p.tensors)}
            for path, p in zip(f.paths, f.pieces)]


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


def report_text(f: ModelFile, out: TextIO, tensors: bool, full: bool, sha: dict[str, Any] | None) -> None:
    w = out.write
    w(f"model         {f.path}\n")
    w(f"file size     {f.file_size:,} bytes ({_size(f.file_size)})\n")
    w(
        f"format        GGUF v{f.version}, {len(f.metadata)} metadata keys, {len(f.tensors)} tensors, "
        f"alignment {f.alignment}, data at byte {f.data_offset:,}\n"
    )
    pieces = _pieces(f)
    if pieces is not None:
        w(f"split model   {len(pieces)} pieces (sizes summed above):\n")
        for i, pc in enumerate(pieces):
            w(f"  {i + 1:>5}  {printable(Path(pc['path']).name)}  {pc['file_size']:,} bytes, {pc['tensors']} tensors\n")
    if sha is not None:
        w(f"sha256        {sha['expected']} verified ({sha['source']})\n")
    arch = f.architecture
    w(f"architecture  {printable(arch) if arch else '(none: no general.architecture key)'}\n")
    ok, how = _support(f)
    w(f"supported     {'yes' if ok else 'no'}: {printable(how)}\n")
    hp = hyperparameters(f)
    if hp:
        width = max(len(printable(s)) for s in hp)
        for short, key in sorted(hp.items()):
            w(f"  {printable(short):<{width}}  {value_text(f.metadata[key], f.metadata_types[key], full)}\n")

    w("\ntensor types\n")
    rows = type_table(f)
    total_bytes = sum(r["bytes"] for r in rows) or 1
    w(f"  {'type':<8} {'tensors':>8} {'elements':>14} {'bytes':>14} {'share':>7}\n")
    for r in rows:
        share = 100.0 * r["bytes"] / total_bytes
        w(f"  {r['type']:<8} {r['tensors']:>8} {r['elements']:>14,} {r['bytes']:>14,} {share:>6.1f}%\n")
    w(
        f"  {'total':<8} {len(f.tensors):>8} {sum(r['elements'] for r in rows):>14,} "
        f"{sum(r['bytes'] for r in rows):>14,}\n"
    )

    w(f"\nmetadata ({len(f.metadata)} keys)\n")
    if f.metadata:
        kw = max(len(printable(k)) for k in f.metadata)
        tw = max(len(_type_label(t)) for t in f.metadata_types.values())
        for k, v in f.metadata.items():
            types = f.metadata_types[k]
            w(f"  {printable(k):<{kw}}  {_type_label(types):<{tw}}  {value_text(v, types, full)}\n")

    if tensors:
        w(f"\ntensors ({len(f.tensors)})\n")
        nw = max([len(printable(t.name)) for t in f.tensors] + [4])
        w(f"  {'#':>4}  {'name':<{nw}}  {'shape':<22} {'type':<7} {'offset':>14} {'bytes':>12}\n")
        for i, t in enumerate(f.tensors):
            shape = " x ".join(str(d) for d in t.shape)
            w(f"  {i:>4}  {printable(t.name):<{nw}}  {shape:<22} {t.type_name:<7} {t.offset:>14,} {t.n_bytes:>12,}\n")


def system_text() -> str:
    try:
        from edgellama.native import kernels  # the C extension: loaded only when asked for
    except (ImportError, OSError) as exc:  # not built, or a broken .so: either way, say so
        return f"kernels       C extension not available ({type(exc).__name__}: {exc})\n"
    try:
        return f"kernels       {kernels.isa()}\ncpu features  {kernels.cpu_features()}\n"
    except (AttributeError, OSError, RuntimeError) as exc:  # an older .so without these entry points
        return f"kernels       C extension loaded but did not answer ({type(exc).__name__}: {exc})\n"


# --- checksum ------------------------------------------------------------------------------------


def read_sidecar(sidecar: Path, model: Path) -> str:
    """Expected hex from a `sha256sum` line ("HEX  name" or "HEX *name") or a bare hex digest."""
    try:
        lines = [ln.strip() for ln in sidecar.read_text().splitlines() if ln.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise _Fail(f"cannot read {sidecar}: {exc}", EXIT_NO_MODEL) from None
    candidates = []
    for ln in lines:
        parts = ln.split(None, 1)
        name = parts[1].lstrip("*") if len(parts) > 1 else None
        if _HEX64.match(parts[0]) and (name is None or Path(name).name == model.name or len(lines) == 1):
            candidates.append(parts[0].lower())
    if len(candidates) != 1:
        raise _Fail(f"{sidecar}: no sha256 line for {model.name} (expected 'HEX  {model.name}')", EXIT_NO_MODEL)
    return candidates[0]


def check_sha256(model: Path, given: str | None) -> dict[str, Any] | None:
    from edgellama.default_model import verified

    sidecar = model.with_name(model.name + ".sha256")
    if given is not None:
        if not _HEX64.match(given):
            raise _Fail(f"--sha256 wants 64 hex digits, got {given!r}", EXIT_NO_MODEL)
        expected, source = given.lower(), "--sha256"
    elif sidecar.is_file():
        expected, source = read_sidecar(sidecar, model), str(sidecar)
    else:
        return None
    # verified() remembers a match in a MODEL.verified stamp (size + mtime), so a re-run is instant.
    if not verified(model, expected):
        raise _Fail(f"{model}: sha256 mismatch: the file does not hash to {expected} (from {source})",
                    EXIT_BAD_MODEL)
    return {"expected": expected, "source": source, "ok": True}


def check_split_sha256(f: SplitGGUF, given: str | None) -> dict[str, Any] | None:
    """A split model: --sha256 HEX is checked against the whole model as `merge` would write it (the
    original file's hash); the first piece's sidecar FIRST.sha256, a manifest with a line per piece
    (what `edgellama split` writes), is checked piece by piece."""
    from edgellama.default_model import verified
    from edgellama.gguf.split import manifest_path, merged_sha256

    if given is not None:
        if not _HEX64.match(given):
            raise _Fail(f"--sha256 wants 64 hex digits, got {given!r}", EXIT_NO_MODEL)
        if merged_sha256(f) != given.lower():
            raise _Fail(f"{f.path}: sha256 mismatch: the {len(f.pieces)} pieces merged do not hash to {given}",
                        EXIT_BAD_MODEL)
        return {"expected": given.lower(), "source": "--sha256 (the pieces merged)", "ok": True}
    manifest = manifest_path(f.path)
    if not manifest.is_file():
        return None
    for path in f.paths:
        expected = read_sidecar(manifest, path)
        if not verified(path, expected):
            raise _Fail(f"{path}: sha256 mismatch: the piece does not hash to {expected} (from {manifest})",
                        EXIT_BAD_MODEL)
    return {"expected": f"{len(f.paths)} pieces", "source": str(manifest), "ok": True}


# --- entry points --------------------------------------------------------------------------------


def _model_path(arg: Path | None) -> Path:
    from edgellama.default_model import ModelNotAvailable, default_model_path
    from edgellama.registry import resolve_model

    try:
        return resolve_model(arg) if arg is not None else default_model_path()
    except ModelNotAvailable as exc:
        raise _Fail(str(exc), EXIT_NO_MODEL) from None


def memory_plan(f: ModelFile, args: argparse.Namespace) -> Any:
    """The plan edgellama run would make, from the header alone (no weights are read)."""
    from edgellama.cli.common import check_model_args
    from edgellama.llm import DEFAULT_CTX, default_threads
    from edgellama.memplan import BudgetError, choose_plan, make_plan, parse_size
    from edgellama.native.lib import KernelError
    from edgellama.wiring import ModelError, build_desc

    try:
        budget = parse_size(args.mem_budget) if args.mem_budget else None
        check_model_args(args)
        if not 1 <= args.parallel <= 256:
            raise ValueError(f"--parallel {args.parallel} is out of range (1..256)")
        hp, desc = build_desc(f)
        threads = args.threads or default_threads()
        train = hp.n_ctx_train or DEFAULT_CTX
        loras = []
        if args.lora:  # the adapters' arrays are what they add: read (and checked against the model)
            from edgellama.lora.adapter import read_adapter

            loras = [read_adapter(path, f) for path, _scale in args.lora]
        try:
            return choose_plan(desc, args.ctx_size or None, train if budget else min(train, DEFAULT_CTX),
                               args.batch_size, args.cache_type, threads, budget, args.numerics, args.parallel,
                               loras)
        except BudgetError:
            return make_plan(desc, args.ctx_size or 64, args.batch_size, args.cache_type, threads, budget,
                             args.numerics, args.parallel, loras)
    except (ModelError, ValueError, KernelError) as exc:
        raise _Fail(str(exc), EXIT_BAD_MODEL) from None


SEVERAL_FLAGS = ("--models-dir", "--config", "--alias", "--default-model", "--models-max")


def several_models(argv: list[str]) -> bool:
    """`info --plan` given serve's flags for several models (-m NAME=FILE, --models-dir, --config, ...):
    models_plan answers it, with serve's own parser."""
    from edgellama.service.model_config import split_entry

    if "--plan" not in argv:
        return False
    for i, a in enumerate(argv):
        if a.split("=", 1)[0] in SEVERAL_FLAGS:
            return True
        value = argv[i + 1] if a in ("-m", "--model") and i + 1 < len(argv) else (
            a.split("=", 1)[1] if a.startswith("--model=") else None)
        if value is not None and split_entry(value)[0] is not None:
            return True
    return False


def models_plan(argv: list[str]) -> int:
    """Each model's memory plan and the sets of them that fit the budget together, read from the flags
    `edgellama serve` would be given (its parser, its --config file); exit 1 if one fits not even alone."""
    from edgellama.cli import serve
    from edgellama.cli.common import Parser
    from edgellama.memplan import parse_size, physical_memory
    from edgellama.service import config
    from edgellama.service.models import plan_report

    p = Parser(prog="edgellama info --plan", description="the memory plans of serve's models")
    serve.add_parser(p.add_subparsers())
    as_json = "--json" in argv
    args = p.parse_args(["serve", *(a for a in argv if a not in ("--plan", "--json"))])
    try:
        config.merge(args)
        cfg = serve.models(args)
        budget = parse_size(args.mem_budget) if args.mem_budget else physical_memory()
        text, doc, ok = plan_report(cfg, budget)
    except (OSError, ValueError) as exc:
        print(f"edgellama: error: {exc}", file=sys.stderr)
        return EXIT_BAD_MODEL
    if as_json:
        json.dump({"plans": doc}, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(text)
    return EXIT_OK if ok else EXIT_BAD_MODEL


def run(args: argparse.Namespace) -> int:
    out = sys.stdout
    try:
        if args.system and not args.json:
            out.write(system_text())
        if args.model is not None and args.model_opt is not None:
            raise _Fail("give the model once: MODEL or -m MODEL", EXIT_NO_MODEL)
        path = _model_path(args.model_opt if args.model_opt is not None else args.model)
        if not path.exists():
            raise _Fail(f"{path}: no such file", EXIT_NO_MODEL)
        if path.is_dir():
            raise _Fail(f"{path}: is a directory, not a GGUF file", EXIT_NO_MODEL)
        try:
            f = open_model_file(path)
        except GGUFError as exc:
            raise _Fail(f"invalid GGUF: {exc}", EXIT_BAD_MODEL) from None
        with f:
            sha = check_sha256(path, args.sha256) if not isinstance(f, SplitGGUF) else check_split_sha256(f, args.sha256)
            if args.json:
                doc = report_json(f, args.full, sha)
                if args.system:
                    doc["system"] = system_text()
                json.dump(doc, out, ensure_ascii=False, indent=1)
                out.write("\n")
            else:
                report_text(f, out, args.tensors, args.full, sha)
            if getattr(args, "plan", False):
                plan = memory_plan(f, args)
                if args.json:
                    json.dump({"plan": plan.as_dict()}, out, indent=1)
                    out.write("\n")
                else:
                    slots = f", {plan.n_seq} slots" if plan.n_seq > 1 else ""
                    out.write(f"\nmemory plan (context {plan.n_ctx}{slots}):\n{plan.table()}\n")
                if not plan.fits:
                    raise _Fail("the model does not fit the memory budget with this context"
                                + (f" and {plan.n_seq} slots" if plan.n_seq > 1 else ""), EXIT_BAD_MODEL)
        out.flush()
    except _Fail as exc:
        print(f"edgellama: error: {exc}", file=sys.stderr)
        return exc.code
    except BrokenPipeError:  # `edgellama info | head`: the reader left, which is not an error
        # Point stdout at /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    from edgellama.cli.common import Parser

    parser = Parser(prog="edgellama")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["info", *(sys.argv[1:] if argv is None else argv)])
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
