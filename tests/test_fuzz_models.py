"""The fuzz harness's seeded subset: mutated model metadata (tiny synthetic models, SmolLM2 and Gemma 3
when installed) and fuzzed flags end in success or a clean one-line error, never a traceback, a signal
or a hang. The full run is `python bench/fuzz_models.py` (thousands of cases)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fuzz_models", ROOT / "bench" / "fuzz_models.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up while being defined
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_fuzzed_models_and_flags_end_in_success_or_a_clean_error() -> None:
    fz = _harness()
    report = fz.fuzz(quick=200, real=True, seed=24, fresh_every=25, nice=0, real_per_model=3)
    bad = fz.failures(report)
    detail = "\n".join(f"{r['outcome']}: {c['source']} {c['key']!r} {c['mutation']!r}\n{r['stderr']}" for c, r in bad)
    assert not bad, fz.table(report) + "\n" + detail
    outcomes = {r["outcome"] for r in report["results"]}
    assert len(report["results"]) >= 200 and report["fresh"]
    assert "clean error" in outcomes and "ok" in outcomes  # the harness sees both kinds of ending
