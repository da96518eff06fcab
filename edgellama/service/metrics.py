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
        with self.lock:
            lines: list[str] = []

            def metric(name: str, kind: str, help_: str, value: float) -> None:
                lines.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {_num(value)}"])

            metric("llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed.",
                   self.prompt_tokens)
            metric("llamacpp:prompt_seconds_total", "counter", "Prompt process time", self.prompt_seconds)
            metric("llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed.",
                   self.tokens_predicted)
            metric("llamacpp:tokens_predicted_seconds_total", "counter", "Predict process time",
                   self.tokens_predicted_seconds)
            metric("llamacpp:n_decode_total", "counter", "Total number of llama_decode() calls", self.n_decode)
            metric("llamacpp:prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.",
                   self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0)
            metric("llamacpp:predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.",
                   self.tokens_predicted / self.tokens_predicted_seconds if self.tokens_predicted_seconds else 0.0)
            n_ctx = max(1, int(gauges["n_ctx"]))
            metric("llamacpp:kv_cache_usage_ratio", "gauge", "KV-cache usage. 1 means 100 percent usage.",
                   gauges["kv_cache_tokens"] / n_ctx)
            metric("llamacpp:kv_cache_tokens", "gauge", "KV-cache tokens.", gauges["kv_cache_tokens"])
            metric("llamacpp:requests_processing", "gauge", "Number of requests processing.",
                   gauges["requests_processing"])
            metric("llamacpp:requests_deferred", "gauge", "Number of requests deferred.", gauges["requests_deferred"])
            metric("edgellama:prompt_tokens_cached_total", "counter",
                   "Prompt tokens served from the KV cache (prefix reuse) instead of evaluated.",
                   self.prompt_tokens_cached)
            metric("edgellama:connections", "gauge", "Open client connections.", gauges["connections"])
            name = "edgellama:queue_wait_seconds"
            lines += [f"# HELP {name} Time from a request's arrival to its slot.", f"# TYPE {name} histogram"]
            for le, n in zip(QUEUE_WAIT_BUCKETS, self.wait_buckets):
                lines.append(f'{name}_bucket{{le="{le}"}} {n}')
            lines += [f'{name}_bucket{{le="+Inf"}} {self.wait_count}', f"{name}_sum {_num(self.wait_sum)}",
                      f"{name}_count {self.wait_count}"]
            name = "edgellama:requests_total"
            lines += [f"# HELP {name} Finished requests by outcome (a stop reason or an error code).",
                      f"# TYPE {name} counter"]
            lines += [f'{name}{{outcome="{k}"}} {v}' for k, v in sorted(self.outcomes.items())]
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


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.6f}"


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
