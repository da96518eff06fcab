"""Log lines on stderr (or --log-file) that journald understands: a `<N>` syslog priority prefix
when stderr is the journal's stream, text or JSON (--log-format json) with the request's fields.

Prompts and outputs reach the log only through fields the server adds under --log-prompts.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any, TextIO

# logging level -> syslog priority (sd-daemon(3) prefixes)
_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


def journal_stream(stream: TextIO) -> bool:
    """True when stream is the journal's own stream ($JOURNAL_STREAM is "device:inode" of it)."""
    js = os.environ.get("JOURNAL_STREAM", "")
    if ":" not in js:
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError):
        return False
    dev, _, ino = js.partition(":")
    return f"{st.st_dev}:{st.st_ino}" == f"{dev}:{ino}"


class Formatter(logging.Formatter):
    def __init__(self, fmt: str, journal: bool) -> None:
        super().__init__()
        self.json = fmt == "json"
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = getattr(record, "fields", None) or {}
        if record.exc_info and record.exc_info[1] is not None:  # log.exception: what failed, and where
            exc = record.exc_info[1]
            fields = {**fields, "error": f"{type(exc).__name__}: {exc}"}
            fields.setdefault("trace", self.formatException(record.exc_info))
        msg = record.getMessage()
        if self.json:
            obj: dict[str, Any] = {"ts": round(record.created, 3), "level": record.levelname.lower(), "msg": msg}
            obj.update(fields)
            line = json.dumps(obj, ensure_ascii=False, default=str)
        else:
            extra = " ".join(f"{k}={_text_value(v)}" for k, v in fields.items() if k != "trace")
            line = f"{msg} {extra}" if extra else msg
            if not self.journal:  # journald stamps lines itself
                stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created))
                line = f"{stamp} {record.levelname.lower():7} {line}"
            if fields.get("trace"):
                line += "\n" + str(fields["trace"]).rstrip()
        if self.journal:
            prefix = f"<{_PRIORITY.get(record.levelno, 6)}>"
            line = "\n".join(prefix + part for part in line.split("\n"))
        return line


def _text_value(v: Any) -> str:
    s = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
    return json.dumps(s, ensure_ascii=False) if (" " in s or not s or "\n" in s) else s


class ReopenableHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """stderr, or a file reopened on SIGHUP (after logrotate moved it away)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        super().__init__(self._open() if path else sys.stderr)

    def _open(self) -> TextIO:
        assert self.path is not None
        return open(self.path, "a", encoding="utf-8", buffering=1)

    def reopen(self) -> None:
        if not self.path:
            return
        self.acquire()
        try:
            old = self.stream
            self.stream = self._open()
            old.close()
        finally:
            self.release()


def setup(fmt: str = "text", path: str | None = None, level: str = "info") -> ReopenableHandler:
    handler = ReopenableHandler(path)
    handler.setFormatter(Formatter(fmt, journal=path is None and journal_stream(sys.stderr)))
    logger = logging.getLogger("edgellama")
    for h in list(logger.handlers):
        logger.removeHandler(h)
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
    return handler
