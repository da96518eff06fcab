"""Progress lines for long work (assembling a model, perplexity chunks, bench rows): on stderr, and
only when stderr is a terminal, so pipes, logs and --json output never carry them."""

from __future__ import annotations

import sys
import time

_quiet = False


def silence() -> None:
    """No progress for the rest of the process (the CLI under --json)."""
    global _quiet
    _quiet = True


def enabled() -> bool:
    return not _quiet and sys.stderr.isatty()


class Bar:
    """One self-overwriting stderr line: `edgellama: WHAT  NN% (done/total)`; silent off a tty."""

    def __init__(self, what: str, total: int, unit: str = "MB", scale: float = 1e6) -> None:
        self.what, self.total, self.unit, self.scale = what, total, unit, scale
        self.on = enabled() and total > 0
        self.last = 0.0

    def update(self, done: int) -> None:
        now = time.monotonic()
        if not self.on or (now - self.last < 0.2 and done < self.total):
            return
        self.last = now
        pct = 100.0 * done / self.total
        sys.stderr.write(f"\redgellama: {self.what} {pct:5.1f}% ({done / self.scale:.0f}/{self.total / self.scale:.0f} "
                         f"{self.unit})")
        sys.stderr.flush()

    def close(self) -> None:
        if self.on:
            sys.stderr.write("\n")
            sys.stderr.flush()


def note(text: str) -> None:
    """A one-off progress line (tty only)."""
    if enabled():
        sys.stderr.write(f"edgellama: {text}\n")
        sys.stderr.flush()
