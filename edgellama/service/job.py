"""A request as the engine thread sees it: the parsed request, the callback its events go to, and
what the log and metrics report about it. No logic: the scheduler decides, the server delivers."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgellama.service.protocol import Completion, Embedding


@dataclass
class Job:
    req: Completion | Embedding
    emit: Callable[[dict[str, Any]], None]  # called from the engine thread (or the loop for queued jobs)
    t_arrival: float = field(default_factory=time.monotonic)
    cancelled: str | None = None  # "cancelled" (by the client), "gone" (client closed), "shutdown"
    finished: bool = False
    slot: int = -1
    stats: dict[str, Any] = field(default_factory=dict)
    output: list[str] = field(default_factory=list)  # kept only with --log-prompts
    prompt_text: str = ""
    model: str = ""  # the name of the model that answers it
    scheduler: Any = None  # the scheduler it was queued on (cancel goes there)
