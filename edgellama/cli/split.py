"""`edgellama split` and `edgellama merge`: a model as pieces in llama.cpp's gguf-split format
(FAT32's 4 GB limit, fleets pushing pieces) and back. Every command that takes a model opens a
split set by its first piece."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "split", help="split a GGUF model into pieces (llama-gguf-split's format)",
        description="Write MODEL as PREFIX-00001-of-0000N.gguf ... (metadata in the first piece), as "
        "llama-gguf-split --split does, and a sha256 manifest PREFIX-00001-of-0000N.gguf.sha256.")
    p.add_argument("model", type=Path, help="GGUF file (or the first piece of a split set)")
    p.add_argument("prefix", help="output prefix: PREFIX-00001-of-0000N.gguf ...")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--split-max-tensors", type=int, metavar="N", help="at most N tensors a piece (default 128)")
    g.add_argument("--split-max-size", metavar="SIZE",
                   help="at most SIZE of tensor data a piece: N followed by M (10^6) or G (10^9), e.g. 2G")
    p.add_argument("--no-tensor-first-split", action="store_true",
                   help="the first piece holds only the metadata")
    p.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
    p.add_argument("--no-manifest", action="store_true", help="do not write the sha256 manifest")
    p.add_argument("--json", action="store_true", help="print the pieces as JSON")
    p.set_defaults(handler=split_cmd)
    m = sub.add_parser(
        "merge", help="merge a split GGUF model back into one file",
        description="Write the split model opened by its first piece as one GGUF file (the split.* keys "
        "dropped): a set made from a usual file merges back byte for byte.")
    m.add_argument("first", type=Path, help="the first piece, PREFIX-00001-of-0000N.gguf")
    m.add_argument("out", type=Path, help="output GGUF file")
    m.add_argument("--force", action="store_true", help="replace OUT if it exists")
    m.set_defaults(handler=merge_cmd)


def split_cmd(args: argparse.Namespace) -> int:
    from edgellama.default_model import sha256_file
    from edgellama.gguf.split import manifest_path, parse_split_size, split_model, write_manifest

    if not args.model.exists():
        raise FileNotFoundError(f"{args.model}: no such file")
    size = parse_split_size(args.split_max_size) if args.split_max_size else None
    tensors = args.split_max_tensors
    if size is None and tensors is None:
        tensors = 128  # llama-gguf-split's default
    pieces = split_model(args.model, args.prefix, max_tensors=tensors, max_size=size,
                         no_tensor_first_split=args.no_tensor_first_split, dry_run=args.dry_run)
    manifest = None
    if not args.dry_run and not args.no_manifest:
        manifest = write_manifest([p for p, _ in pieces], manifest_path(pieces[0][0]), sha256_file)
    if args.json:
        doc = {"pieces": [{"path": str(p), "tensors": n, **({} if args.dry_run else {"file_size": p.stat().st_size})}
                          for p, n in pieces], "manifest": str(manifest) if manifest else None}
        json.dump(doc, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    for p, n in pieces:
        size_text = "" if args.dry_run else f", {p.stat().st_size:,} bytes"
        print(f"{p}: {n} tensors{size_text}")
    if manifest is not None:
        print(f"{manifest}: sha256 of every piece")
    return 0


def merge_cmd(args: argparse.Namespace) -> int:
    from edgellama.gguf.split import merge_model

    if not args.first.exists():
        raise FileNotFoundError(f"{args.first}: no such file")
    out = merge_model(args.first, args.out, force=args.force)
    print(f"{out}: {out.stat().st_size:,} bytes")
    return 0
