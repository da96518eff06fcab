"""`edgellama export-lora -m BASE --lora FILE [--lora-scaled FILE S] -o OUT`: llama-export-lora's job,
adapters merged into a new GGUF; merged tensors keep the base tensor's type unless --outtype says."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


class _AddAdapter(argparse.Action):
    """--lora FILE and --lora-scaled FILE S into one list, in command-line order (the merge order)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        items: list[tuple[Path, float]] = getattr(namespace, self.dest) or []
        if option_string == "--lora":
            items.append((Path(values), 1.0))
        else:
            path, scale = values
            try:
                items.append((Path(path), float(scale)))
            except ValueError:
                parser.error(f"--lora-scaled {path} {scale}: the scale is not a number")
        setattr(namespace, self.dest, items)


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "export-lora", help="merge LoRA adapters into a new GGUF model (llama-export-lora)",
        description="Write BASE with the adapters merged in: W' = W + sum(scale * B @ A) for every tensor "
        "an adapter touches (scale = S * alpha / rank), computed in float32 and quantized back to the "
        "base tensor's type (or --outtype); every other tensor and the metadata are copied as they are.")
    p.add_argument("-m", "--model", type=Path, required=True, help="base GGUF model (a split model by its first piece)")
    p.add_argument("--lora", dest="adapters", action=_AddAdapter, metavar="FILE",
                   help="LoRA adapter (GGUF) merged at scale 1; repeatable")
    p.add_argument("--lora-scaled", dest="adapters", action=_AddAdapter, nargs=2, metavar=("FILE", "S"),
                   help="LoRA adapter merged at scale S; repeatable")
    p.add_argument("-o", "--output", type=Path, required=True, help="output GGUF file")
    p.add_argument("--outtype", metavar="TYPE",
                   help="type of the merged tensors, e.g. F16, Q8_0 (default: each base tensor's type)")
    p.add_argument("-t", "--threads", type=int, default=1, help="threads merging slabs of rows (default 1)")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.set_defaults(handler=export_lora_cmd, adapters=[])


def export_lora_cmd(args: argparse.Namespace) -> int:
    from edgellama.gguf.ggml_types import type_name
    from edgellama.gguf.quant_mix import tensor_type
    from edgellama.lora.export import Merged, export_lora

    for path in [args.model, *(a for a, _ in args.adapters)]:
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file")
    if not args.adapters:
        raise ValueError("give at least one adapter with --lora FILE or --lora-scaled FILE S")
    if args.output.exists() and not args.force:
        raise FileExistsError(f"{args.output}: already exists (give --force to replace it)")
    outtype = tensor_type(args.outtype) if args.outtype else None

    def progress(i: int, n: int, m: Merged) -> None:
        if sys.stderr.isatty() and not args.json:
            sys.stderr.write(f"\r[{i + 1:4d}/{n:4d}] {m.name:<40} {type_name(m.src_type):>5} -> "
                             f"{type_name(m.out_type):<5}" + ("\n" if i + 1 == n else ""))
            sys.stderr.flush()

    t0 = time.perf_counter()
    r = export_lora(args.model, args.adapters, args.output, outtype=outtype, threads=args.threads,
                    progress=progress)
    secs = time.perf_counter() - t0
    if args.json:
        json.dump({"out": str(r.path), "size_out": r.size_out, "seconds": round(secs, 3), "tensors": r.n_tensors,
                   "adapters": [{"path": str(a.path), "alpha": a.alpha, "scale": s, "tensors": len(a.weights)}
                                for a, (_, s) in zip(r.adapters, args.adapters)],
                   "merged": [{"name": m.name, "from": type_name(m.src_type), "to": type_name(m.out_type),
                               "adapters": m.n_adapters} for m in r.merged]}, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(f"{r.path}: merged {len(r.adapters)} adapter(s) into {len(r.merged)} of {r.n_tensors} tensors, "
              f"{r.size_out:,} bytes in {secs:.1f} s")
    return 0
