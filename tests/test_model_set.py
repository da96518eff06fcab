"""The model set's rules against fake engines (tests/fake_engine.py), and its configuration read from serve's
own flags: names, tables, aliases, --models-dir; an alias splitting 1,000 requests by weight; which model
is unloaded for another (least recently used, never one with a request running); keep_alive durations.
The real models behind a real socket: tests/test_service_models.py."""

from __future__ import annotations

import argparse
import math
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from edgellama.memplan import BASE_OVERHEAD, MemoryPlan
from edgellama.service import config
from edgellama.service import protocol as P
from edgellama.service.job import Job
from edgellama.service.model_config import ModelsConfig, models_config, scan_dir, split_entry
from edgellama.service.models import ModelSet, fitting_sets, together
from edgellama.service.scheduler import EngineConfig
from tests.fake_engine import FakeLLM, expected_answer

MIB = 1 << 20


def serve_args(*argv: str, toml: str | None = None, tmp: Path | None = None) -> argparse.Namespace:
    from edgellama.cli import build_parser

    extra: list[str] = []
    if toml is not None:
        assert tmp is not None
        (tmp / "c.toml").write_text(toml)
        extra = ["--config", str(tmp / "c.toml")]
    args = build_parser().parse_args(["serve", *argv, *extra])
    return config.merge(args)


def test_model_entries_and_names(tmp_path: Path) -> None:
    assert split_entry("chat=/m/a.gguf") == ("chat", "/m/a.gguf")
    assert split_entry("/m/a.gguf") == (None, "/m/a.gguf")
    odd = tmp_path / "x=y.gguf"
    odd.write_bytes(b"")
    assert split_entry(str(odd)) == (None, str(odd))  # an existing path with '=' stays a path
    cfg = models_config(serve_args("-m", "a=/m/a.gguf", "-m", "/m/Other-Model.Q4_K.gguf", "-c", "512"))
    assert cfg.several and list(cfg.models) == ["a", "Other-Model.Q4_K"] and cfg.default == "a"
    assert cfg.models["a"].opts.ctx_size == 512 and cfg.models["a"].opts.mem_budget is None
    with pytest.raises(ValueError, match="named twice"):
        models_config(serve_args("-m", "a=/m/a.gguf", "-m", "a=/m/b.gguf"))
    with pytest.raises(ValueError, match="a model name is"):
        models_config(serve_args("-m", "c=/m/c.gguf", "--alias", "a b=c"))
    with pytest.raises(ValueError, match="--default-model zz: no such model"):
        models_config(serve_args("-m", "a=/m/a.gguf", "--default-model", "zz"))


def test_one_model_stays_one_model(tmp_path: Path) -> None:
    f = tmp_path / "tiny.gguf"
    f.write_bytes(b"GGUF")
    cfg = models_config(serve_args("-m", str(f), "--mem-budget", "300M"))
    assert not cfg.several and list(cfg.models) == ["tiny.gguf"]
    assert cfg.models["tiny.gguf"].opts.mem_budget == "300M"  # one model keeps the largest context in budget


def test_tables_and_aliases(tmp_path: Path) -> None:
    toml = '''
ctx-size = 1024
[models.v1]
model = "/m/v1.gguf"
sha256 = "ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789"
[models.v2]
model = "/m/v2.gguf"
ctx-size = 2048
parallel = 2
cache-type = "q8_0"
keep-alive = "5m"
lora = [["/m/ad.gguf", 0.5]]
[models.embed]
model = "/m/e.gguf"
embedding = true
[aliases]
chat = {v1 = 90, v2 = 10}
stable = "v1"
'''
    cfg = models_config(serve_args("--alias", "next=v2", toml=toml, tmp=tmp_path))
    assert list(cfg.models) == ["v1", "v2", "embed"]
    v1, v2 = cfg.models["v1"], cfg.models["v2"]
    assert v1.sha256 == "abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789"
    assert v1.opts.ctx_size == 1024 and v2.opts.ctx_size == 2048  # the service's value, a table's over it
    assert v2.opts.parallel == 2 and v2.opts.cache_type == "q8_0" and v2.keep_alive == 300.0
    assert v2.opts.lora == [(Path("/m/ad.gguf"), 0.5)] and cfg.models["embed"].opts.embedding
    assert cfg.aliases == {"chat": [("v1", 90.0), ("v2", 10.0)], "stable": [("v1", 1.0)], "next": [("v2", 1.0)]}
    bad = {"[models.v1]\nmodel = \"/m/a\"\nfrobnicate = 1\n": "unknown key 'frobnicate'",
           "[models.v1]\nmodel = \"/m/a\"\nsha256 = \"xyz\"\n": "sha256 must be 64 hex digits",
           "[models.v1]\nmodel = \"/m/a\"\nctx-size = \"big\"\n": "ctx-size",
           "[models.v1]\nmodel = \"/m/a\"\nsocket = \"/x\"\n": "unknown key 'socket'",
           "[models.v1]\nctx-size = 5\n": "needs a model",
           "[models.v1]\nmodel = \"/m/a\"\n[aliases]\nchat = {v9 = 1}\n": "no model 'v9'",
           "[models.v1]\nmodel = \"/m/a\"\n[aliases]\nchat = {v1 = -1}\n": "positive number",
           "[models.v1]\nmodel = \"/m/a\"\n[aliases]\nv1 = \"v1\"\n": "also a model's name"}
    for text, message in bad.items():
        with pytest.raises(ValueError, match=message):
            models_config(serve_args(toml=text, tmp=tmp_path))


def test_models_dir(tmp_path: Path) -> None:
    for name in ("a.gguf", "big-00001-of-00002.gguf", "big-00002-of-00002.gguf", "mmproj-a.gguf", "readme.md"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "sub.gguf").mkdir()
    assert [n for n, _ in scan_dir(str(tmp_path))] == ["a", "big"]
    cfg = models_config(serve_args("--models-dir", str(tmp_path), "-m", "a=/elsewhere/a.gguf"))
    assert cfg.models["a"].opts.model == "/elsewhere/a.gguf"  # a model named on the command line keeps its file
    with pytest.raises(ValueError, match="no .gguf files"):
        scan_dir(str(tmp_path / "sub.gguf"))


@pytest.mark.parametrize(("text", "seconds"), [("5m", 300.0), ("1h30m", 5400.0), ("90s", 90.0), ("1.5h", 5400.0),
                                               ("-1", -1.0), ("-5m", -1.0), (0, 0.0), (30, 30.0), ("250ms", 0.25),
                                               ("0", 0.0)])
def test_keep_alive_durations(text: Any, seconds: float) -> None:
    assert P.keep_alive(text) == seconds


@pytest.mark.parametrize("bad", ["soon", "5x", "m5", "", True, [1], float("inf")])
def test_keep_alive_refusals(bad: Any) -> None:
    with pytest.raises(P.ProtocolError):
        P.keep_alive(bad)


# ---- the set's rules, over fake engines ----

class Fakes:
    """A ModelSet whose models are FakeLLMs with made-up plans (each model `size` MiB besides the
    interpreter) under a budget; records the loads."""

    def __init__(self, sizes: dict[str, int], budget_mib: int | None, aliases: dict[str, Any] | None = None,
                 models_max: int = 0) -> None:
        args = serve_args(*(a for n in sizes for a in ("-m", f"{n}=/nonexistent/{n}.gguf")))
        cfg = models_config(args)
        cfg = ModelsConfig(cfg.models, aliases or {}, next(iter(sizes)), True, models_max, -1.0)
        for spec in cfg.models.values():
            spec.opts.parallel = 1
        self.loads: list[str] = []
        self.gates: dict[str, threading.Event] = {}
        self.set = ModelSet(cfg, EngineConfig(max_tokens=8, queue=8), budget_mib * MIB if budget_mib else None,
                            lambda host: None, lambda host, exc: None, load=self._load)
        for name, host in self.set.hosts.items():
            host.plan = MemoryPlan(n_ctx=256, n_batch=16, kv_type="f16", n_threads=1, weights=sizes[name] * MIB,
                                   kv_cache=0, scratch=0, logits=0, overhead=BASE_OVERHEAD)
            host.plan_identity = host.source_identity()  # () for a file that does not exist: the plan stays

    def _load(self, spec: Any) -> Any:
        self.loads.append(spec.name)
        llm = FakeLLM(n_seq=1)
        llm.file = _NoFile()
        gate = self.gates.get(spec.name)
        if gate is not None:
            decode = llm.engine.decode

            def held(*a: Any, **k: Any) -> Any:
                gate.wait(30)
                return decode(*a, **k)

            llm.engine.decode = held  # type: ignore[method-assign]
        return llm

    def ask(self, name: str | None, prompt: str = "abc.") -> tuple[Job, threading.Event, list[dict[str, Any]]]:
        host, _ = self.set.resolve(name)
        req = P.parse_object({"id": prompt, "prompt": prompt, "temperature": 0})
        assert isinstance(req, P.Completion)
        events: list[dict[str, Any]] = []
        ended = threading.Event()

        def emit(ev: dict[str, Any]) -> None:
            events.append(ev | {"model": host.name})
            if ev["event"] in ("done", "error"):  # as the server's loop does, not under the scheduler's lock
                threading.Thread(target=lambda: (self.set.touched(host, None), ended.set())).start()

        job = Job(req, emit, model=host.name)
        self.set.submit(host, job)
        return job, ended, events

    def run(self, name: str | None) -> list[dict[str, Any]]:
        _job, ended, events = self.ask(name)
        assert ended.wait(10), events
        return events

    def state(self) -> dict[str, str]:
        return {i.name: i.state for i in self.set.states()}

    def wait_closed(self) -> None:
        deadline = time.monotonic() + 10
        while self.set.retiring and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        for gate in self.gates.values():
            gate.set()
        threads = self.set.schedulers()
        self.set.stop()
        for s in threads:
            s.thread.join(10)


class _NoFile:
    """model_files() of a fake: no file, so no identity to compare."""

    path = Path("/nonexistent/fake.gguf")


@pytest.fixture(autouse=True)
def no_files(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("edgellama.service.models.model_files", lambda f: [])


def test_an_alias_splits_requests_by_weight() -> None:
    fx = Fakes({"v1": 10, "v2": 10}, None, aliases={"chat": [("v1", 90.0), ("v2", 10.0)]})
    try:
        answered: dict[str, int] = {"v1": 0, "v2": 0}
        pending = []
        for i in range(1000):
            _job, ended, events = fx.ask("chat", prompt=f"req{i}.")
            pending.append((ended, events))
            if len(pending) >= 6:  # within the queue: 1 slot + 8 waiting per model
                for e, evs in pending:
                    assert e.wait(10)
                    assert evs[-1]["event"] == "done"
                    answered[evs[-1]["model"]] += 1
                pending = []
        for e, evs in pending:
            assert e.wait(10)
            answered[evs[-1]["model"]] += 1
        assert sum(answered.values()) == 1000
        # binomial(1000, 0.1): mean 100, standard deviation 9.5; 5 of them either way
        assert abs(answered["v2"] - 100) < 5 * math.sqrt(1000 * 0.1 * 0.9), answered
        assert fx.set.alias_counts[("chat", "v1")] == answered["v1"]
        assert fx.set.alias_counts[("chat", "v2")] == answered["v2"]
    finally:
        fx.close()


def test_answers_and_the_least_recently_used_model_makes_room() -> None:
    fx = Fakes({"a": 100, "b": 100, "c": 100}, 100 * 2 + 32 + 1)  # any two at once, never three
    try:
        for name in ("a", "b", "a"):
            events = fx.run(name)
            assert "".join(e.get("text", "") for e in events) == expected_answer("abc.", 8)
        assert fx.state() == {"a": "loaded", "b": "loaded", "c": "unloaded"}
        fx.run("c")  # b was used longest ago
        assert fx.state() == {"a": "loaded", "b": "unloaded", "c": "loaded"}
        fx.wait_closed()
        assert fx.set.held_bytes() == together([fx.set.hosts[n].plan for n in ("a", "c")])  # type: ignore[misc]
        assert fx.loads == ["a", "b", "c"] and fx.set.swaps == 1
        fx.run("b")  # now a is the oldest
        assert fx.state() == {"a": "unloaded", "b": "loaded", "c": "loaded"}
    finally:
        fx.close()


def test_models_max_counts_models() -> None:
    fx = Fakes({"a": 1, "b": 1}, None, models_max=1)
    try:
        fx.run("a")
        fx.run("b")
        assert fx.state() == {"a": "unloaded", "b": "loaded"}
    finally:
        fx.close()


def test_a_model_with_a_request_running_is_never_unloaded_for_another() -> None:
    fx = Fakes({"a": 100, "b": 100}, 100 + 32 + 1)  # one at a time
    fx.gates["a"] = gate = threading.Event()
    try:
        fx.run("b")
        _job, a_done, a_events = fx.ask("a")  # b is idle: unloaded for a; a's decode then holds
        deadline = time.monotonic() + 10
        while fx.state()["a"] != "loaded" and time.monotonic() < deadline:
            time.sleep(0.01)
        _job, b_done, b_events = fx.ask("b")
        time.sleep(0.3)
        assert fx.state() == {"a": "loaded", "b": "loading"}  # b waits: a has a request running
        assert not fx.set.unload("a")  # nor is it unloaded on request
        assert not b_done.is_set()
        gate.set()
        assert a_done.wait(10) and b_done.wait(10)
        assert a_events[-1]["event"] == "done" and b_events[-1]["event"] == "done"
        assert fx.state() == {"a": "unloaded", "b": "loaded"}
    finally:
        fx.close()


def test_a_failed_load_refuses_its_requests_by_name_and_others_serve() -> None:
    fx = Fakes({"a": 1, "bad": 1}, None)
    real = fx._load

    def load(spec: Any) -> Any:
        if spec.name == "bad":
            raise ValueError("bad.gguf: not a GGUF file")
        return real(spec)

    fx.set.load = load
    try:
        _job, ended, events = fx.ask("bad")
        assert ended.wait(10)
        assert events[-1]["code"] == P.UNAVAILABLE and "model bad is unavailable: bad.gguf" in events[-1]["message"]
        assert fx.state()["bad"] == "failed"
        with pytest.raises(P.ProtocolError, match="model bad is unavailable"):
            fx.ask("bad")
        assert fx.run("a")[-1]["event"] == "done"
        with pytest.raises(P.ProtocolError, match="not found"):
            fx.ask("zz")
    finally:
        fx.close()


def test_keep_alive_zero_unloads_when_idle() -> None:
    fx = Fakes({"a": 1, "b": 1}, None)
    try:
        host, _ = fx.set.resolve("a")
        _job, ended, _events = fx.ask("a")
        assert ended.wait(10)
        fx.set.touched(host, 0.0)
        assert fx.state()["a"] == "unloaded"
        fx.run("a")
        fx.set.touched(host, 0.2)
        fx.set.reap()
        assert fx.state()["a"] == "loaded"
        time.sleep(0.25)
        fx.set.reap()
        assert fx.state()["a"] == "unloaded"
    finally:
        fx.close()


def test_fitting_sets() -> None:
    def plan(mib: int) -> MemoryPlan:
        return MemoryPlan(n_ctx=1, n_batch=1, kv_type="f16", n_threads=1, weights=mib * MIB, kv_cache=0, scratch=0,
                          logits=0, overhead=BASE_OVERHEAD)

    plans = {"a": plan(100), "b": plan(200), "c": plan(300)}
    assert fitting_sets(plans, (32 + 300) * MIB, 0) == [("a", "b"), ("c",)]
    assert fitting_sets(plans, None, 0) == [("a", "b", "c")]
    assert fitting_sets(plans, None, 2) == [("a", "b"), ("a", "c"), ("b", "c")]
