"""`edgellama convert DIR OUT.gguf`: a Hugging Face model folder to GGUF, the file llama.cpp's
convert_hf_to_gguf.py writes (BERT so far), with its --outtype names and default (f16)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("convert", help="convert a Hugging Face model folder to GGUF (BERT embedding models)",
                       description=__doc__)
    p.add_argument("folder", type=Path, help="the model folder: config.json, model.safetensors, tokenizer files")
    p.add_argument("out", type=Path, help="output GGUF file")
    p.add_argument("--outtype", choices=("f32", "f16", "q8_0"), default="f16",
                   help="weight type: f32, f16 (default) or q8_0; norms, biases and position/token-type "
                   "embeddings stay F32, as llama.cpp's converter keeps them")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.set_defaults(handler=convert_cmd)


def _progress(name: str, ggml_type: int) -> None:
    from edgellama.gguf.ggml_types import type_name

    if sys.stderr.isatty():
        sys.stderr.write(f"\r{name:<40} -> {type_name(ggml_type):<5}")
        sys.stderr.flush()


def convert_cmd(args: argparse.Namespace) -> int:
    from edgellama.convert import convert

    if not args.folder.is_dir():
        raise FileNotFoundError(f"{args.folder}: no such directory")
    if args.out.exists() and not args.force:
        raise FileExistsError(f"{args.out}: already exists (give --force to replace it)")
    t0 = time.perf_counter()
    r = convert(args.folder, args.out, args.outtype, progress=_progress)
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    mix = ", ".join(f"{n} {k}" for k, n in sorted(r.types.items()))
    print(f"{r.path}: bert {r.outtype}, {r.n_params:,} parameters, {r.size:,} bytes ({mix}) "
          f"in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0
