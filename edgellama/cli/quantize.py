"""`edgellama quantize IN OUT TYPE`: llama-quantize's job (its type names, mixes and options), with
the same tensor types and bytes; streams tensor by tensor."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from edgellama.gguf.quant_mix import FILE_TYPES


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "quantize", help="quantize a GGUF model (llama-quantize's types and mixes)",
        description="Quantize MODEL to TYPE, choosing each tensor's type as llama-quantize does (no "
        f"importance matrix). TYPE: {' '.join(FILE_TYPES)} (Q3_K, Q4_K, Q5_K: the _M mixes).")
    p.add_argument("model", type=Path, help="input GGUF (F32/F16/BF16, or quantized with --allow-requantize; "
                   "a split model by its first piece)")
    p.add_argument("out", type=Path, help="output GGUF file")
    p.add_argument("type", help="file type, e.g. Q4_K_M, Q8_0, Q4_0")
    p.add_argument("-t", "--threads", type=int, default=1, help="threads converting slabs of rows (default 1)")
    p.add_argument("--allow-requantize", action="store_true",
                   help="allow quantizing tensors that are already quantized (loses quality)")
    p.add_argument("--pure", action="store_true", help="every quantizable tensor gets TYPE's default type")
    p.add_argument("--leave-output-tensor", action="store_true", help="leave output.weight as it is")
    p.add_argument("--output-tensor-type", metavar="T", help="type of output.weight")
    p.add_argument("--token-embedding-type", metavar="T", help="type of token_embd.weight")
    p.add_argument("--override-kv", action="append", default=[], metavar="KEY=TYPE:VALUE",
                   help="set a metadata key in the output (TYPE int, float, bool, str); repeatable")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument("--json", action="store_true", help="print a JSON summary (tensor types, sizes)")
    p.set_defaults(handler=quantize_cmd)


def quantize_cmd(args: argparse.Namespace) -> int:
    from edgellama.gguf.ggml_types import type_name
    from edgellama.gguf.quant_mix import Options, tensor_type
    from edgellama.quantize_model import parse_override, quantize_model, stderr_progress

    if not args.model.exists():
        raise FileNotFoundError(f"{args.model}: no such file")
    if args.out.exists() and not args.force:
        raise FileExistsError(f"{args.out}: already exists (give --force to replace it)")
    if args.threads < 1:
        raise ValueError(f"-t {args.threads}: must be at least 1")
    opts = Options(pure=args.pure, quantize_output=not args.leave_output_tensor,
                   output_type=tensor_type(args.output_tensor_type) if args.output_tensor_type else None,
                   token_embedding_type=tensor_type(args.token_embedding_type) if args.token_embedding_type else None)
    overrides = [parse_override(o) for o in args.override_kv]
    t0 = time.perf_counter()
    r = quantize_model(args.model, args.out, args.type, opts=opts, allow_requantize=args.allow_requantize,
                       threads=args.threads, overrides=overrides, progress=None if args.json else stderr_progress)
    secs = time.perf_counter() - t0
    counts: dict[str, int] = {}
    for c in r.choices:
        counts[type_name(c.new_type)] = counts.get(type_name(c.new_type), 0) + 1
    if args.json:
        json.dump({"out": str(r.path), "file_type": r.file_type, "size_in": r.size_in, "size_out": r.size_out,
                   "seconds": round(secs, 3), "types": counts,
                   "tensors": [{"name": c.name, "from": type_name(c.src_type), "to": type_name(c.new_type),
                                "fallback": c.fallback} for c in r.choices]}, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        mix = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        print(f"{r.path}: {r.file_type}, {r.size_out:,} bytes ({mix}) in {secs:.1f} s")
    return 0
