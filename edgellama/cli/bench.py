"""`edgellama bench`: llama-bench's two tests. pp N: one batch of N prompt tokens; tg N: N tokens
generated one at a time. Repeated, reported as mean +/- stdev tok/s in markdown or JSON.
With --parallel 1,2,4: llama-batched-bench's test instead (N sequences decoded together), aggregate and
per-stream tok/s, and generation against one slot measured in the same run."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from edgellama.bench import bench, bench_parallel
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
    p.add_argument("--parallel", type=int_list, default=None, metavar="N,N",
                   help="sequences decoded together, e.g. 1,2,4 (llama-batched-bench); one slot is always measured")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    check_range("-r/--repetitions", args.repetitions, 1, MAX_REPETITIONS)
    check_model_args(args)
    for flag, sizes in (("-p/--n-prompt", args.n_prompt), ("-n/--n-gen", args.n_gen)):
        for n in sizes:
            check_range(flag, n, 0, MAX_CTX)
    from edgellama.llm import default_threads

    threads = [t or default_threads() for t in args.threads]
    if args.parallel is not None:
        if args.lora:
            raise ValueError("--lora / --lora-scaled are measured without --parallel")
        return _run_parallel(args, threads)
    rows = bench(model_path(args), threads, args.n_prompt, args.n_gen, args.repetitions, args.ctx_size or 0,
                 args.cache_type, args.numerics, progress=not args.json, loras=args.lora)
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


def _run_parallel(args: argparse.Namespace, threads: list[int]) -> int:
    for n in args.parallel:
        check_range("--parallel", n, 1, 256)
    rows = bench_parallel(model_path(args), threads, args.parallel, args.n_prompt, args.n_gen, args.repetitions,
                          args.ctx_size or 0, args.cache_type, args.batch_size, progress=not args.json)
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    print("| model | isa | threads | PP | TG | B | S_PP t/s | S_TG t/s | per stream t/s | S_TG vs 1 slot |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['model']} | {r['isa']} | {r['threads']} | {r['n_prompt']} | {r['n_gen']} | {r['parallel']} | "
              f"{r['pp_tok_s']:.2f} | {r['tg_tok_s']:.2f} ± {r['tg_tok_s_stdev']:.2f} | {r['tg_tok_s_per_stream']:.2f} | "
              f"{r['tg_vs_1_slot']:.2f}x |")
    return 0
