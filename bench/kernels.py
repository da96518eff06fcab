"""Matvec throughput of the C kernels (GB/s of weight bytes streamed) beside this machine's read bandwidth,
and with --batch N the prefill case: N activation rows per matmul, in activation rows (tokens) per second.

A benchmark, not a test: run it on a quiet machine (`uptime`); it times, it does not check numbers. On a
loaded one, --cpu-time reports work per CPU second (process time, all threads) instead of wall time.

    python bench/kernels.py [--isa scalar|avx2|avx512|...] [--types Q8_0,Q5_0] [--threads 1,2] [--repeat 3]
    python bench/kernels.py --batch 128 --types Q5_0,Q8_0,Q4_K,Q6_K,Q4_1 --shapes 2048x640,640x2048
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgellama.gguf.ggml_types import TYPE_SIZES, GGMLType
from edgellama.native import kernels
from edgellama.native.engine import Pool
from edgellama.native.lib import ffi, lib

# The real model's matrix shapes as (rows, cols): 640x2048 is the FFN up/gate projection (2048 rows of
# 640), 2048x640 the FFN down projection, 640x262144 the tied output matrix (the biggest per token).
SHAPES = [(2048, 640), (640, 2048), (262144, 640)]
DEFAULT_TYPES = "Q8_0,Q5_0,Q4_K,Q6_K,Q4_0,Q4_1,Q5_1,Q2_K,Q3_K,Q5_K,F16,BF16,F32"

# byte offsets of the fp16 scale fields in each block; random bytes elsewhere are valid quants
SCALE_FIELDS: dict[int, list[int]] = {
    GGMLType.Q4_0: [0], GGMLType.Q4_1: [0, 2], GGMLType.Q5_0: [0], GGMLType.Q5_1: [0, 2],
    GGMLType.Q8_0: [0], GGMLType.Q2_K: [80, 82], GGMLType.Q3_K: [108], GGMLType.Q4_K: [0, 2],
    GGMLType.Q5_K: [0, 2], GGMLType.Q6_K: [208],
}

READ_BW_C = r"""
#include <pthread.h>
#include <stdint.h>
#include <stddef.h>
typedef struct { const uint64_t *p; size_t n; uint64_t out; } job;
static void *sum_run(void *a) {
    job *j = a;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    size_t i = 0;
    for (; i + 8 <= j->n; i += 8) {   /* integer adds: reorderable, so the compiler vectorises */
        s0 += j->p[i]; s1 += j->p[i + 1]; s2 += j->p[i + 2]; s3 += j->p[i + 3];
        s4 += j->p[i + 4]; s5 += j->p[i + 5]; s6 += j->p[i + 6]; s7 += j->p[i + 7];
    }
    for (; i < j->n; i++) s0 += j->p[i];
    j->out = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
    return NULL;
}
uint64_t bench_read(const uint64_t *p, size_t n, int nth) {
    pthread_t t[16];
    job jobs[16];
    if (nth < 1) nth = 1;
    if (nth > 16) nth = 16;
    for (int k = 0; k < nth; k++) {
        jobs[k].p = p + n * k / nth;
        jobs[k].n = n * (k + 1) / nth - n * k / nth;
        if (k) pthread_create(&t[k], NULL, sum_run, &jobs[k]);
    }
    sum_run(&jobs[0]);
    uint64_t s = jobs[0].out;
    for (int k = 1; k < nth; k++) { pthread_join(t[k], NULL); s += jobs[k].out; }
    return s;
}
"""


def build_read_bw() -> Callable[[npt.NDArray[np.uint64], int], int] | None:
    """A C sum-read loop over threads (compiled once into a temp dir), or None without a compiler."""
    try:
        from cffi import FFI

        b = FFI()
        b.cdef("uint64_t bench_read(const uint64_t *p, size_t n, int nth);")
        b.set_source("_el_bench_bw", READ_BW_C, extra_compile_args=["-O3", "-march=native", "-pthread"],
                     extra_link_args=["-pthread"])
        tmp = tempfile.mkdtemp(prefix="el_bench_")
        so = b.compile(tmpdir=tmp, verbose=False)
        sys.path.insert(0, os.path.dirname(so))
        import _el_bench_bw  # type: ignore[import-not-found]

        mod: Any = _el_bench_bw

        def run(a: npt.NDArray[np.uint64], nth: int) -> int:
            return int(mod.lib.bench_read(mod.ffi.from_buffer("uint64_t[]", a), a.size, nth))

        return run
    except Exception as exc:  # noqa: BLE001 - fall back to numpy, say why
        print(f"(C read loop unavailable: {exc}; using numpy sum, 1 thread)")
        return None


def measure_read_bw(nbytes: int, threads: list[int], repeat: int) -> dict[int, float]:
    a = np.ones(nbytes // 8, dtype=np.uint64)  # touched, so pages are resident before timing
    run = build_read_bw()
    out: dict[int, float] = {}
    for nth in threads:
        samples = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            if run is not None:
                run(a, nth)
            else:
                a.sum()
            samples.append(a.nbytes / (time.perf_counter() - t0) / 1e9)
        out[nth] = statistics.median(samples)
    return out


def random_weights(wtype: int, rows: int, cols: int, rng: np.random.Generator) -> npt.NDArray[np.uint8]:
    """Valid weight bytes fast: random quants with sane fp16 scales (timing does not depend on values)."""
    if wtype == GGMLType.F32:
        return rng.standard_normal(rows * cols, dtype=np.float32).view(np.uint8)
    if wtype == GGMLType.F16:
        return rng.standard_normal(rows * cols, dtype=np.float32).astype(np.float16).view(np.uint8)
    if wtype == GGMLType.BF16:
        f = rng.standard_normal(rows * cols, dtype=np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    bs, ts = TYPE_SIZES[wtype]
    nblk = rows * cols // bs
    raw = rng.integers(0, 256, size=(nblk, ts), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    for off in SCALE_FIELDS[wtype]:
        raw[:, off:off + 2] = scale
    return raw.reshape(-1)


class Matvec:
    """el_matmul with prebuilt cffi buffers, so the timing holds as little Python as possible."""

    def __init__(self, w: npt.NDArray[np.uint8], wtype: int, rows: int, cols: int, pool: Pool, n_vec: int = 1) -> None:
        self.w, self.wtype, self.rows, self.cols, self.pool, self.n_vec = w, wtype, rows, cols, pool, n_vec
        self.x = np.random.default_rng(1).standard_normal(cols * n_vec, dtype=np.float32)
        self.y = np.empty(rows * n_vec, dtype=np.float32)
        self.wb = ffi.from_buffer(w)
        self.xb = ffi.from_buffer("float[]", self.x)
        self.yb = ffi.from_buffer("float[]", self.y)

    def __call__(self) -> None:
        st = lib.el_matmul(self.pool.ptr, self.wtype, self.wb, self.w.size, self.rows, self.cols,
                           self.xb, self.n_vec, self.yb)
        if st != 0:
            raise RuntimeError(f"el_matmul failed: {st}")


def time_gbs(fn: Callable[[], None], nbytes: int, min_time: float, cpu_time: bool = False) -> float:
    """nbytes (or any unit of work) per second of wall time, or per CPU second of this process."""
    clock = time.process_time if cpu_time else time.perf_counter
    fn()  # warm: pool workers awake, scratch allocated
    iters = 1
    while True:
        t0 = clock()
        for _ in range(iters):
            fn()
        dt = clock() - t0
        if dt >= min_time:
            return nbytes * iters / dt / 1e9
        iters = max(iters * 2, int(iters * min_time / max(dt, 1e-9)) + 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--isa", default=None, help="kernel set: scalar, avx2, neon, neon-dotprod (default: best)")
    ap.add_argument("--types", default=DEFAULT_TYPES, help="comma-separated weight types")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--repeat", type=int, default=3, help="repeats per figure (the median is printed)")
    ap.add_argument("--min-time", type=float, default=0.25, help="seconds per timed sample")
    ap.add_argument("--bw-mb", type=int, default=1024, help="size of the read-bandwidth array in MB")
    ap.add_argument("--shapes", default=None, help="override shapes, e.g. 262144x640 (rows x cols)")
    ap.add_argument("--batch", type=int, default=1,
                    help="activation rows per matmul (prefill: 128); > 1 prints activation rows per second")
    ap.add_argument("--cpu-time", action="store_true", help="per CPU second of the process (a loaded machine)")
    args = ap.parse_args(argv)
    if args.batch > 1:
        return main_batch(args)

    if args.isa is not None:
        kernels.set_isa(args.isa)
    threads = [int(t) for t in args.threads.split(",")]
    shapes = SHAPES if args.shapes is None else [
        (int(r), int(c)) for r, c in (s.split("x") for s in args.shapes.split(","))]
    try:
        load = os.getloadavg()
        print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (shared machine: figures need it low)")
    except OSError:
        pass
    print(f"isa {kernels.isa()}  cpu features: {kernels.cpu_features()}  repeats {args.repeat} (median)")

    bw = measure_read_bw(args.bw_mb << 20, threads, args.repeat)
    bw_text = "  ".join(f"{t} thr {g:6.2f} GB/s" for t, g in bw.items())
    print(f"read bandwidth (sum of a {args.bw_mb} MB array): {bw_text}")

    rng = np.random.default_rng(0)
    pools = {t: Pool(t) for t in threads}
    head = f"{'type':6} {'rows x cols':>14} {'MB':>7} " + " ".join(f"{f'{t} thr GB/s':>11}" for t in threads)
    head += " " + " ".join(f"{f'{t}thr/bw':>8}" for t in threads)
    print(head)
    try:
        for name in args.types.split(","):
            wtype = int(GGMLType[name.strip().upper()])
            bs = TYPE_SIZES[wtype].block_size
            for rows, cols in shapes:
                # K-quants need whole 256-value super-blocks per row: 640 becomes 768 for them
                c = -(-cols // bs) * bs
                w = random_weights(wtype, rows, c, rng)
                figs: list[float] = []
                for t in threads:
                    mv = Matvec(w, wtype, rows, c, pools[t])
                    figs.append(statistics.median(time_gbs(mv, w.size, args.min_time, args.cpu_time)
                                                  for _ in range(args.repeat)))
                line = f"{name:6} {f'{rows}x{c}':>14} {w.size / 1e6:7.1f} " + " ".join(f"{g:11.2f}" for g in figs)
                line += " " + " ".join(f"{g / bw[t]:8.0%}" for g, t in zip(figs, threads))
                print(line, flush=True)
                del w
    finally:
        for p in pools.values():
            p.close()
        kernels.set_isa(None)
    return 0


def main_batch(args: argparse.Namespace) -> int:
    """Prefill: n_vec = --batch rows through each matrix; activation rows (tokens) per second."""
    if args.isa is not None:
        kernels.set_isa(args.isa)
    threads = [int(t) for t in args.threads.split(",")]
    shapes = [(2048, 640), (640, 2048), (1024, 640)] if args.shapes is None else [
        (int(r), int(c)) for r, c in (s.split("x") for s in args.shapes.split(","))]
    types = args.types if args.types != DEFAULT_TYPES else "Q5_0,Q8_0,Q4_K,Q6_K,Q4_1"
    try:
        load = os.getloadavg()
        print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (shared machine: figures need it low)")
    except OSError:
        pass
    unit = "per CPU s" if args.cpu_time else "per s"
    print(f"isa {kernels.isa()}  batch {args.batch}  repeats {args.repeat} (median), rows x n_vec {unit}")
    rng = np.random.default_rng(0)
    pools = {t: Pool(t) for t in threads}
    print(f"{'type':6} {'rows x cols':>14} " + " ".join(f"{f'{t} thr tok/s':>12} {'Gdot/s':>7}" for t in threads))
    try:
        for name in types.split(","):
            wtype = int(GGMLType[name.strip().upper()])
            bs = TYPE_SIZES[wtype].block_size
            for rows, cols in shapes:
                c = -(-cols // bs) * bs
                w = random_weights(wtype, rows, c, rng)
                cells = []
                for t in threads:
                    mm = Matvec(w, wtype, rows, c, pools[t], args.batch)
                    # time_gbs counts its work unit in 1e9: a unit of 1e9 makes it calls per second
                    calls = statistics.median(time_gbs(mm, 10**9, args.min_time, args.cpu_time)
                                              for _ in range(args.repeat))
                    # tokens/s through this one matrix, and row dot products (of c values) per second
                    cells.append(f"{calls * args.batch:12.0f} {calls * args.batch * rows / 1e9:7.3f}")
                print(f"{name:6} {f'{rows}x{c}':>14} " + " ".join(cells), flush=True)
    finally:
        for p in pools.values():
            p.close()
        kernels.set_isa(None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
