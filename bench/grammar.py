"""Constrained decoding cost: generation tok/s under the bundled `json` grammar and under a JSON Schema,
against unconstrained generation of the same model in the same run, and grammar compile times.

    python bench/grammar.py [-m gemma3,smollm2-135m-instruct] [-n 96] [-r 3] [-t 2] [--json]

Each round runs the three modes back to back (unconstrained, json, schema) with the same prompt and
seed, rotating the order between rounds so a change in the host's load hits all alike; the figure is
the median of the rounds' generation tok/s (LLM timings: sampling, grammar and forward passes, the
prompt excluded). `masked` counts the steps where the sampled token was refused and the whole
vocabulary had to be filtered. llama-cpp-python's LlamaGrammar is measured too when it is installed
(it is not a dependency; see bench/vs_llamacpp.py for how to build it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgellama.grammar import constrain, grammar_file, grammar_from_schema, parse
from edgellama.grammar.compile import flatten
from edgellama.grammar.matcher import CompiledGrammar, vocab_trie

PROMPT = ("Describe a fictional person as a JSON object with the fields name, age, city, email, "
          "hobbies (a list), employed (true or false) and a short bio.\n")
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"}, "city": {"type": "string"},
    "email": {"type": "string"}, "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 6},
    "employed": {"type": "boolean"}, "bio": {"type": "string"}},
    "required": ["name", "age", "city", "email", "hobbies", "employed", "bio"], "additionalProperties": False}


def schema_20() -> dict[str, Any]:
    types = [{"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"},
             {"type": "array", "items": {"type": "string"}, "maxItems": 5},
             {"enum": ["red", "green", "blue"]}, {"type": "string", "format": "date"}]
    props = {f"field_{i}": types[i % len(types)] for i in range(20)}
    return {"type": "object", "properties": props, "required": list(props)[:12]}


def ms(f: Any, reps: int = 5) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best * 1000.0


def compile_times() -> dict[str, float]:
    text = grammar_file("json")
    s20 = schema_20()
    return {"json_grammar_ms": round(ms(lambda: CompiledGrammar(parse(text))), 2),
            "schema20_ms": round(ms(lambda: CompiledGrammar(grammar_from_schema(s20))), 2),
            "schema20_rules": len(flatten(grammar_from_schema(s20))[1])}


def run_mode(llm: Any, ids: list[int], mode: str, n: int, seed: int) -> tuple[float, int, int]:
    from edgellama.sampling import Sampler, SamplerParams

    sampler: Any = Sampler(SamplerParams(temp=0.8, seed=seed), llm.n_ctx)
    if mode == "json":
        sampler = constrain(sampler, parse(grammar_file("json")), llm.tokenizer)
    elif mode == "schema":
        sampler = constrain(sampler, grammar_from_schema(SCHEMA), llm.tokenizer)
    done = None
    for ev in llm.generate(ids, sampler, n):
        done = ev
    assert done is not None
    return done.timings.rate(done.timings.gen_tokens, done.timings.gen_ms), done.timings.gen_tokens, \
        getattr(sampler, "n_masked", 0)


def llamacpp_modes(path: Path, n: int, rounds: int, threads: int) -> dict[str, float] | None:
    try:
        from llama_cpp import Llama, LlamaGrammar  # type: ignore[import-not-found]
    except ImportError:
        return None
    llm = Llama(str(path), n_ctx=1024, n_threads=threads, verbose=False, seed=1)
    grammars = {"none": None, "json": LlamaGrammar.from_string(grammar_file("json"), verbose=False),
                "schema": LlamaGrammar.from_json_schema(json.dumps(SCHEMA), verbose=False)}
    rates: dict[str, list[float]] = {m: [] for m in grammars}
    for _ in range(rounds):
        for mode, g in grammars.items():
            t0 = time.perf_counter()
            out = llm(PROMPT, max_tokens=n, temperature=0.8, seed=1, grammar=g)
            # prompt time is included here (llama-cpp-python reports no split); the prompt is cached after
            # the first call, so the later rounds time generation
            rates[mode].append(out["usage"]["completion_tokens"] / (time.perf_counter() - t0))
    return {m: round(statistics.median(v), 2) for m, v in rates.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--models", default="gemma3,smollm2-135m-instruct")
    ap.add_argument("-n", "--n-predict", type=int, default=96)
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    from edgellama.llm import LLM

    report: dict[str, Any] = {"compile": compile_times(), "models": {}}
    for name in args.models.split(","):
        from edgellama.default_model import default_model_path

        with LLM(default_model_path() if name == "gemma3" else name, n_ctx=1024, n_threads=args.threads) as llm:
            t0 = time.perf_counter()
            trie = vocab_trie(llm.tokenizer)
            trie_ms = (time.perf_counter() - t0) * 1000.0
            ids = llm.tokenizer.encode(PROMPT)
            modes = ["none", "json", "schema"]
            run_mode(llm, ids, "none", 8, 0)  # warm-up: the prompt goes into the cache
            rates: dict[str, list[float]] = {m: [] for m in modes}
            toks: dict[str, int] = {m: 0 for m in modes}
            masked: dict[str, int] = {m: 0 for m in modes}
            for r in range(args.rounds):
                for mode in modes[r % 3:] + modes[:r % 3]:
                    rate, n, k = run_mode(llm, ids, mode, args.n_predict, seed=r)
                    rates[mode].append(rate)
                    toks[mode] += n
                    masked[mode] += k
            med = {m: statistics.median(v) for m, v in rates.items()}
            entry = {"n_vocab": llm.n_vocab, "trie_nodes": trie.n_nodes, "trie_build_ms": round(trie_ms, 1),
                     "tok_s": {m: round(v, 2) for m, v in med.items()},
                     "ratio_json": round(med["json"] / med["none"], 3),
                     "ratio_schema": round(med["schema"] / med["none"], 3),
                     "tokens": toks, "masked_steps": masked}
            lc = llamacpp_modes(llm.path, args.n_predict, args.rounds, args.threads)
            if lc is not None:
                entry["llamacpp_tok_s"] = lc
                entry["llamacpp_ratio_json"] = round(lc["json"] / lc["none"], 3)
                entry["llamacpp_ratio_schema"] = round(lc["schema"] / lc["none"], 3)
            else:
                entry["llamacpp"] = "llama-cpp-python not installed"
            report["models"][name] = entry
    if args.json:
        print(json.dumps(report))
        return 0
    c = report["compile"]
    print(f"compile: json grammar {c['json_grammar_ms']} ms, 20-property schema {c['schema20_ms']} ms "
          f"({c['schema20_rules']} rules)")
    for name, e in report["models"].items():
        t = e["tok_s"]
        print(f"{name} (vocab {e['n_vocab']}, trie {e['trie_nodes']} nodes built in {e['trie_build_ms']} ms): "
              f"none {t['none']} tok/s, json {t['json']} ({e['ratio_json']}x), schema {t['schema']} "
              f"({e['ratio_schema']}x); tokens {e['tokens']}, masked steps {e['masked_steps']}")
        if "llamacpp_tok_s" in e:
            print(f"  llama.cpp: {e['llamacpp_tok_s']} json {e['llamacpp_ratio_json']}x "
                  f"schema {e['llamacpp_ratio_schema']}x")
        else:
            print(f"  llama.cpp: {e['llamacpp']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
