"""A real `edgellama serve` process on a real UNIX socket, and a small protocol v1 client, for the
service tests, the soak test and bench/serve.py."""

from __future__ import annotations

import contextlib
import http.client
import importlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

ROOT = Path(__file__).resolve().parent.parent
FAST = ["-c", "256", "-t", "1", "-b", "64"]  # short tests on a shared machine


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "JOURNAL_STREAM"):
        env.pop(key, None)
    env.update(extra or {})
    return env


class Conn:
    """One client connection: send request objects, read event objects."""

    def __init__(self, path: str, timeout: float = 120.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.reader = self.sock.makefile("rb")

    def send(self, obj: dict[str, Any]) -> None:
        self.send_raw((json.dumps(obj) + "\n").encode())

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def event(self) -> dict[str, Any]:
        line = self.reader.readline()
        if not line:
            raise EOFError("the server closed the connection")
        ev: dict[str, Any] = json.loads(line)
        return ev

    def until_final(self, ids: set[Any]) -> dict[Any, list[dict[str, Any]]]:
        """Events per id until each of ids got its done or error."""
        got: dict[Any, list[dict[str, Any]]] = {i: [] for i in ids}
        open_ids = set(ids)
        while open_ids:
            ev = self.event()
            got.setdefault(ev.get("id"), []).append(ev)
            if ev["event"] in ("done", "error") and ev.get("id") in open_ids:
                open_ids.discard(ev["id"])
        return got

    def ask(self, req: dict[str, Any]) -> list[dict[str, Any]]:
        self.send(req)
        return self.until_final({req["id"]})[req["id"]]

    def close(self) -> None:
        self.reader.close()
        self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class UnixHTTP(http.client.HTTPConnection):
    """http.client over the server's UNIX socket (keep-alive: one connection, several requests)."""

    def __init__(self, path: str, timeout: float = 120.0) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["text"] for e in events if e["event"] == "token") + events[-1].get("content", "")


class ServerProc:
    """`python -m edgellama.cli serve` on a socket in a fresh short directory (AF_UNIX paths are short)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, argv: list[str] | None = None,
                 nice: int = 5, journal: bool = False, engine: list[str] | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="elsv", dir="/tmp"))
        self.path = str(self.dir / "s.sock")
        self.log = self.dir / "stderr.log"
        cmd = argv if argv is not None else [sys.executable, "-m", "edgellama.cli", "serve", "--socket", self.path,
                                             *(FAST if engine is None else engine), *args]
        self.errf = open(self.log, "wb")  # noqa: SIM115 - the server's stderr for its whole life
        env = dict(env or {})
        if journal:  # as systemd does: JOURNAL_STREAM names the device and inode of stderr
            st = os.fstat(self.errf.fileno())
            env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        self.proc = subprocess.Popen(["nice", "-n", str(nice), *cmd], stdout=subprocess.DEVNULL, stderr=self.errf,
                                     env=cli_env(env))

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.stderr()}")
            try:
                with Conn(self.path, timeout=10) as c:
                    c.send({"type": "health", "id": "h"})
                    if c.event()["status"] == "ok":
                        return
            except (OSError, EOFError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not ready in {timeout} s: {self.stderr()}")

    def connect(self, timeout: float = 120.0) -> Conn:
        return Conn(self.path, timeout)

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def records(self) -> list[dict[str, Any]]:
        """The JSON log lines written so far; a line still being written (no newline yet) is left out:
        the server may be mid-write while a test reads its log."""
        text = self.stderr()
        done = text[: text.rfind("\n") + 1]
        return [json.loads(line) for line in done.splitlines() if line.startswith("{")]

    def health(self) -> dict[str, Any]:
        with self.connect() as c:
            c.send({"type": "health", "id": "h"})
            return c.event()

    def metrics(self) -> dict[str, float]:
        """Prometheus text -> {name{labels}: value}."""
        with self.connect() as c:
            c.send({"type": "metrics", "id": "m"})
            text = c.event()["text"]
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def terminate(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.errf.close()

    def kill(self) -> None:
        """Ends the server if still running and removes its directory (call last: the log goes too)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.errf.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def openai_over_unix_socket(path: str) -> Iterator[Any]:
    """The real openai SDK talking to the server's UNIX socket through its httpx transport's uds=."""
    from tests.conftest import skip_or_fail

    try:
        openai = importlib.import_module("openai")
    except ImportError:
        skip_or_fail("the openai package is not installed (pip install openai)")
    # the httpx the SDK is built on (httpx, or httpx2 in newer releases): its transport takes uds=
    base = next(c for c in openai.DefaultHttpxClient.__mro__[1:] if c.__name__ == "Client")
    httpx = importlib.import_module(base.__module__.split(".")[0])
    with httpx.Client(transport=httpx.HTTPTransport(uds=path)) as http_client:
        yield openai.OpenAI(base_url="http://localhost/v1", api_key="unused-on-the-unix-socket",
                            http_client=http_client, max_retries=0)


@contextlib.contextmanager
def serving(*args: str, **kw: Any) -> Iterator[ServerProc]:
    """`edgellama serve ARGS`, ready; killed (its folder removed) when the block ends: a module's server fixture."""
    srv = ServerProc(*args, **kw)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.kill()
