"""Counters and gauges of the service, rendered as Prometheus text with llama-server's names.

Updated by the engine thread and read by the I/O loop, so every access holds one lock; nothing
here blocks or allocates per token.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

QUEUE_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prompt_tokens = 0  # prompt tokens evaluated (not the cached ones)
        self.prompt_tokens_cached = 0
        self.prompt_seconds = 0.0
        self.tokens_predicted = 0
        self.tokens_predicted_seconds = 0.0
        self.n_decode = 0  # forward passes: prompt chunks and decode steps
        self.outcomes: Counter[str] = Counter()  # stop reason or error code -> requests
        self.wait_buckets = [0] * len(QUEUE_WAIT_BUCKETS)
        self.wait_count = 0
        self.wait_sum = 0.0
        # serial ports (serial_port.py): port -> up; (port, kind) -> count; port -> [received, sent] bytes
        self.serial_ports: dict[str, bool] = {}
        self.serial_events: Counter[tuple[str, str]] = Counter()
        self.serial_io: dict[str, list[int]] = {}

    def queue_wait(self, seconds: float) -> None:
        with self.lock:
            self.wait_count += 1
            self.wait_sum += seconds
            for i, le in enumerate(QUEUE_WAIT_BUCKETS):
                if seconds <= le:
                    self.wait_buckets[i] += 1

    def prompt(self, n_evaluated: int, n_cached: int, seconds: float, n_decode: int) -> None:
        with self.lock:
            self.prompt_tokens += n_evaluated
            self.prompt_tokens_cached += n_cached
            self.prompt_seconds += seconds
            self.n_decode += n_decode

    def predicted(self, n: int, seconds: float) -> None:
        with self.lock:
            self.tokens_predicted += n
            self.tokens_predicted_seconds += seconds
            self.n_decode += n

    def outcome(self, name: str) -> None:
        with self.lock:
            self.outcomes[name] += 1

    def serial_up(self, port: str, up: bool) -> None:
        with self.lock:
            self.serial_ports[port] = up
            self.serial_io.setdefault(port, [0, 0])

    def serial_event(self, port: str, kind: str) -> None:
        """kind: reconnect, break, framing, corrupt, too_long, timeout, output_overflow, output_dropped."""
        with self.lock:
            self.serial_events[(port, kind)] += 1

    def serial_bytes(self, port: str, received: int = 0, sent: int = 0) -> None:
        with self.lock:
            io = self.serial_io.setdefault(port, [0, 0])
            io[0] += received
            io[1] += sent

    def render(self, gauges: dict[str, Any]) -> str:
        """gauges: requests_processing, requests_deferred, kv_cache_tokens, n_ctx, connections."""
        fams = self.families(gauges)
        fams.append(_family("edgellama:connections", "gauge", "Open client connections.", [("", gauges["connections"])]))
        fams += self._outcome_family()
        with self.lock:
            lines = _lines(fams)
            if self.serial_ports:
                lines += self._render_serial()
        return "\n".join(lines) + "\n"

    def families(self, gauges: dict[str, Any], label: str = "") -> list[Family]:
        """This model's metric families (label: its `model="..."` label, "" for a service of one model)."""
        with self.lock:
            n_ctx = max(1, int(gauges["n_ctx"]))
            one = [
                ("llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed.", self.prompt_tokens),
                ("llamacpp:prompt_seconds_total", "counter", "Prompt process time", self.prompt_seconds),
                ("llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed.",
                 self.tokens_predicted),
                ("llamacpp:tokens_predicted_seconds_total", "counter", "Predict process time",
                 self.tokens_predicted_seconds),
                ("llamacpp:n_decode_total", "counter", "Total number of llama_decode() calls", self.n_decode),
                ("llamacpp:prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.",
                 self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0),
                ("llamacpp:predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.",
                 self.tokens_predicted / self.tokens_predicted_seconds if self.tokens_predicted_seconds else 0.0),
                ("llamacpp:kv_cache_usage_ratio", "gauge", "KV-cache usage. 1 means 100 percent usage.",
                 gauges["kv_cache_tokens"] / n_ctx),
                ("llamacpp:kv_cache_tokens", "gauge", "KV-cache tokens.", gauges["kv_cache_tokens"]),
                ("llamacpp:requests_processing", "gauge", "Number of requests processing.",
                 gauges["requests_processing"]),
                ("llamacpp:requests_deferred", "gauge", "Number of requests deferred.", gauges["requests_deferred"]),
                ("edgellama:prompt_tokens_cached_total", "counter",
                 "Prompt tokens served from the KV cache (prefix reuse) instead of evaluated.",
                 self.prompt_tokens_cached),
            ]
            fams = [_family(n, k, h, [(label, v)]) for n, k, h, v in one]
            if "loaded" in gauges:
                fams.append(_family("edgellama:model_loaded", "gauge", "1 while the model is loaded.",
                                    [(label, gauges["loaded"])]))
                fams.append(_family("edgellama:model_loads_total", "counter", "Times the model was loaded.",
                                    [(label, gauges["loads"])]))
            name = "edgellama:queue_wait_seconds"
            sep = "," if label else ""
            rows = [(f'{label}{sep}le="{le}"', n) for le, n in zip(QUEUE_WAIT_BUCKETS, self.wait_buckets)]
            rows += [(f'{label}{sep}le="+Inf"', self.wait_count)]
            fams.append((name, "histogram", "Time from a request's arrival to its slot.",
                         [(f"{name}_bucket{{{lb}}}", v) for lb, v in rows]
                         + [(f"{name}_sum" + (f"{{{label}}}" if label else ""), self.wait_sum),
                            (f"{name}_count" + (f"{{{label}}}" if label else ""), self.wait_count)]))
        return fams

    def _outcome_family(self, label: str = "") -> list[Family]:
        with self.lock:
            sep = "," if label else ""
            return [_family("edgellama:requests_total", "counter",
                            "Finished requests by outcome (a stop reason or an error code).",
                            [(f'{label}{sep}outcome="{k}"', v) for k, v in sorted(self.outcomes.items())])]

    def render_models(self, models: list[tuple[str, Metrics, dict[str, Any]]], connections: int,
                      aliases: dict[tuple[str, str], int], swaps: int, held: int, budget: int | None) -> str:
        """Several models: each model's families with a `model` label, then the service's own (requests
        refused before reaching a model, connections, serial ports, alias routing, swaps, memory held)."""
        merged: dict[str, Family] = {}
        for name, m, gauges in models:
            label = f'model="{_label(name)}"'
            for fam_name, kind, help_, rows in [*m.families(gauges, label), *m._outcome_family(label)]:
                have = merged.setdefault(fam_name, (fam_name, kind, help_, []))
                have[3].extend(rows)
        fams = list(merged.values())
        own = self._outcome_family()[0]
        merged["edgellama:requests_total"][3].extend(own[3])
        fams.append(_family("edgellama:connections", "gauge", "Open client connections.", [("", connections)]))
        fams.append(_family("edgellama:alias_requests_total", "counter",
                            "Requests for an alias, by the model it chose.",
                            [(f'alias="{_label(a)}",model="{_label(m)}"', n) for (a, m), n in sorted(aliases.items())]))
        fams.append(_family("edgellama:model_swaps_total", "counter",
                            "Loads that first unloaded another model to make room.", [("", swaps)]))
        fams.append(_family("edgellama:models_memory_bytes", "gauge",
                            "Memory plans of the loaded models together.", [("", held)]))
        if budget is not None:
            fams.append(_family("edgellama:models_memory_budget_bytes", "gauge",
                                "The RAM budget of the models loaded together.", [("", budget)]))
        with self.lock:
            lines = _lines(fams)
            if self.serial_ports:
                lines += self._render_serial()
        return "\n".join(lines) + "\n"

    def _render_serial(self) -> list[str]:
        lines: list[str] = []

        def family(name: str, kind: str, help_: str, rows: list[tuple[str, float]]) -> None:
            lines.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}"])
            lines.extend(f"{name}{{{labels}}} {_num(v)}" for labels, v in rows)

        ports = sorted(self.serial_ports)
        family("edgellama:serial_port_up", "gauge", "1 while the serial port is open.",
               [(f'port="{_label(p)}"', int(self.serial_ports[p])) for p in ports])
        family("edgellama:serial_reconnects_total", "counter", "Serial ports reopened after the device was lost.",
               [(f'port="{_label(p)}"', self.serial_events[(p, "reconnect")]) for p in ports])
        family("edgellama:serial_received_bytes_total", "counter", "Bytes read from the serial port.",
               [(f'port="{_label(p)}"', self.serial_io[p][0]) for p in ports])
        family("edgellama:serial_sent_bytes_total", "counter", "Bytes written to the serial port.",
               [(f'port="{_label(p)}"', self.serial_io[p][1]) for p in ports])
        family("edgellama:serial_wire_errors_total", "counter",
               "Wire faults by kind: break, framing, corrupt, too_long, timeout, output_overflow, output_dropped.",
               [(f'port="{_label(p)}",kind="{k}"', n) for (p, k), n in sorted(self.serial_events.items())
                if k != "reconnect"])
        return lines


Family = tuple[str, str, str, list[tuple[str, float]]]  # name, type, help, (sample name or labels, value)


def _family(name: str, kind: str, help_: str, rows: list[tuple[str, float]]) -> Family:
    """rows: (labels, value); a sample's name is the family's."""
    return (name, kind, help_, [(f"{name}{{{lb}}}" if lb else name, v) for lb, v in rows])


def _lines(fams: list[Family]) -> list[str]:
    lines: list[str] = []
    for name, kind, help_, rows in fams:
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        lines += [f"{sample} {_num(v)}" for sample, v in rows]
    return lines


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.6f}"


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
