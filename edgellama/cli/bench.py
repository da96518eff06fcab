"""`edgellama bench`: llama-bench's two tests. pp N: one batch of N prompt tokens; tg N: N tokens
generated one at a time. Repeated, reported as mean +/- stdev tok/s in markdown or JSON."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from edgellama.bench import bench
from edgellama.cli.common import MAX_CTX, add_model_args, check_model_args, check_range, int_list, model_path

MAX_REPETITIONS = 1000


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="prompt-processing and generation speed (like llama-bench)",
                       description=__doc__)
    add_model_args(p, threads_list=True)
    p.add_argument("-p", "--n-prompt", type=int_list, default=[128], help="prompt lengths, e.g. 128,512")
    p.add_argument("-n", "--n-gen", type=int_list, default=[64], help="generation lengths")
    p.add_argument("-r", "--repetitions", type=int, default=5)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    check_range("-r/--repetitions", args.repetitions, 1, MAX_REPETITIONS)
    check_model_args(args)
    for flag, sizes in (("-p/--n-prompt", args.n_prompt), ("-n/--n-gen", args.n_gen)):
        for n in sizes:
            check_range(flag, n, 0, MAX_CTX)
    from edgellama.llm import default_threads

    threads = [t or default_threads() for t in args.threads]
    rows = bench(model_path(args), threads, args.n_prompt, args.n_gen, args.repetitions, args.ctx_size or 0,
                 args.cache_type, args.numerics, progress=not args.json)
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    print("| model | size | arch | isa | numerics | threads | test | t/s |")
    print("| --- | ---: | --- | --- | --- | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['model']} | {r['size_bytes'] / 2**20:.1f} MiB | {r['arch']} | {r['isa']} | {r['numerics']} | {r['threads']} | "
              f"{r['test']} | {r['tok_s_mean']:.2f} ± {r['tok_s_stdev']:.2f} |")
    return 0
