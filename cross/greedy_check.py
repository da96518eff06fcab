"""Greedy generation probe run the same way on the host and on the emulated aarch64 Python: loads a
model, evaluates a reference prompt, then N single-token decode steps (argmax each), and reports.

Prints one JSON line (isa, prompt ids, generated ids, timings); --logits saves every step's logits
(prompt's last token first, then one row per decode step) as a float32 .npy for cross-ISA
comparison; --markers calls getppid() around each step so cross/insn-count-plugin.c can report the
instruction count at each boundary. It must not import anything beyond numpy and edgellama.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from edgellama.cli.common import NUMERICS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--prompt-ids", required=True, help="comma-separated prompt token ids")
    ap.add_argument("-n", "--n-gen", type=int, default=8, help="decode steps (generated tokens)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=128)
    ap.add_argument("--logits", type=Path, help="save the (1 + n) x vocab logits here (.npy)")
    ap.add_argument("--markers", action="store_true", help="getppid() before and after each eval")
    ap.add_argument("--numerics", choices=NUMERICS, default="native")
    args = ap.parse_args(argv)

    from edgellama.llm import LLM
    from edgellama.native import kernels

    # a marker is a syscall no other code here makes; without the plugin it is a cheap no-op
    mark = os.getppid if args.markers else (lambda: 0)
    prompt = [int(x) for x in args.prompt_ids.split(",") if x]
    t0 = time.perf_counter()
    llm = LLM(args.model, n_ctx=args.ctx, n_threads=args.threads, numerics=args.numerics)
    t1 = time.perf_counter()
    mark()
    logits = np.array(llm.eval(prompt), dtype=np.float32)
    mark()
    t2 = time.perf_counter()
    rows = [logits]
    out: list[int] = []
    step_s: list[float] = []
    for _ in range(args.n_gen):
        tok = int(np.argmax(logits))
        out.append(tok)
        ts = time.perf_counter()
        mark()
        logits = np.array(llm.eval([tok]), dtype=np.float32)
        mark()
        step_s.append(round(time.perf_counter() - ts, 3))
        rows.append(logits)
    llm.close()
    if args.logits:
        np.save(args.logits, np.stack(rows))
    report = {
        "isa": kernels.isa(),
        "numerics": args.numerics,
        "features": kernels.cpu_features(),
        "machine": os.uname().machine,
        "prompt": prompt,
        "tokens": out,
        "load_s": round(t1 - t0, 3),
        "prompt_s": round(t2 - t1, 3),
        "step_s": step_s,
    }
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
