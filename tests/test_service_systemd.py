"""The service under systemd's protocols, for real: sd_notify datagrams on a test NOTIFY_SOCKET (with a
stalled engine thread for the watchdog), socket activation by systemd-socket-activate, the unit files
checked by systemd-analyze, the TOML config, and journald/JSON logs with SIGHUP reopening."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service_util import FAST, Conn, ServerProc, cli_env, text_of

needs_systemd = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd tools not installed")


class NotifyListener:
    """A datagram socket standing in for systemd's NOTIFY_SOCKET; records (time, message)."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="elnt", dir="/tmp")
        self.path = os.path.join(self.dir, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self.running = True
        self.thread = threading.Thread(target=self._recv, daemon=True)
        self.thread.start()

    def _recv(self) -> None:
        while self.running:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            self.messages.append((time.monotonic(), data.decode()))

    def wait_for(self, key: str, timeout: float = 180.0, after: float = 0.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, msg in list(self.messages):
                if t >= after and key in msg.split("\n"):
                    return t
            time.sleep(0.05)
        raise TimeoutError(f"no {key} in {self.messages}")

    def times(self, key: str) -> list[float]:
        return [t for t, msg in list(self.messages) if key in msg.split("\n")]

    def close(self) -> None:
        self.running = False
        self.thread.join()
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def notify() -> Iterator[NotifyListener]:
    n = NotifyListener()
    yield n
    n.close()


def test_sd_notify_ready_status_watchdog_and_no_watchdog_while_the_engine_is_stalled(
        gemma_path: Path, notify: NotifyListener, tmp_path: Path) -> None:
    release = tmp_path / "release-engine"
    srv = ServerProc("-m", str(gemma_path), env={"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "1000000",
                                                 "EDGELLAMA_TEST_STALL_UNTIL": str(release)})
    try:
        t_ready = notify.wait_for("READY=1")
        ready_msg = next(m for t, m in notify.messages if t == t_ready)
        assert "STATUS=ready: " in ready_msg and "n_ctx 256" in ready_msg
        assert any(m.startswith("STATUS=loading") for _, m in notify.messages)
        notify.wait_for("WATCHDOG=1", after=t_ready)  # the idle engine thread shows progress
        with srv.connect() as c:
            c.send({"id": "s", "prompt": "Hello", "n_predict": 2})
            t_stall = time.monotonic()  # the engine thread now blocks in the test hook, as a hung decode
            time.sleep(4.0)
            t_release = time.monotonic()
            silent = [t for t in notify.times("WATCHDOG=1") if t_stall + 1.5 <= t <= t_release]
            assert silent == [], "WATCHDOG=1 was sent while the engine thread was stalled"
            release.touch()
            events = c.until_final({"s"})["s"]
        assert events[-1]["event"] == "done"
        notify.wait_for("WATCHDOG=1", after=t_release, timeout=30)  # progress again: pings again
        assert srv.terminate() == 0
        notify.wait_for("STOPPING=1", timeout=10)
    finally:
        srv.kill()


@needs_systemd
def test_socket_activation_by_systemd_socket_activate(gemma_path: Path) -> None:
    if shutil.which("systemd-socket-activate") is None:
        pytest.skip("systemd-socket-activate not installed")
    d = Path(tempfile.mkdtemp(prefix="elsa", dir="/tmp"))
    path = str(d / "activated.sock")
    # --socket names a path that cannot be bound: the server must take systemd's fd instead
    argv = ["systemd-socket-activate", "-l", path, sys.executable, "-m", "edgellama.cli", "serve",
            "-m", str(gemma_path), "--socket", str(d / "missing-dir" / "x.sock"), *FAST]
    srv = ServerProc(argv=argv)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        with Conn(path) as c:  # the first connection starts the server
            events = c.ask({"id": 1, "prompt": "Hello", "n_predict": 3, "temperature": 0})
        assert events[-1]["event"] == "done" and text_of(events)
        assert "activated=true" in srv.stderr()
        assert srv.terminate() == 0
        assert os.path.exists(path)  # systemd's socket, not ours to remove
    finally:
        srv.kill()
        shutil.rmtree(d, ignore_errors=True)


def _install(root: Path) -> Path:
    r = subprocess.run([sys.executable, "-m", "edgellama.cli", "install-service", "--root", str(root)],
                       capture_output=True, text=True, env=cli_env(), check=True)
    assert "edgellama.service" in r.stdout
    return root / "etc/systemd/system"


@needs_systemd
def test_units_verify_clean(tmp_path: Path) -> None:
    units = _install(tmp_path)
    text = (units / "edgellama.service").read_text()
    assert re.search(r"^ExecStart=/\S+ ", text, re.MULTILINE) and "/usr/bin/edgellama" not in text
    assert (tmp_path / "etc/edgellama/edgellama.toml").is_file()
    # a template is verified as an instance: edgellama-serial@ttyUSB0.service, for /dev/ttyUSB0
    (units / "edgellama-serial@ttyUSB0.service").symlink_to("edgellama-serial@.service")
    for unit in ("edgellama.service", "edgellama.socket", "edgellama-serial@ttyUSB0.service"):
        r = subprocess.run(["systemd-analyze", "verify", unit], cwd=units, capture_output=True, text=True,
                           check=False)
        assert r.returncode == 0 and not r.stderr.strip() and not r.stdout.strip(), (unit, r.stdout, r.stderr)
    serial_unit = (units / "edgellama-serial@.service").read_text()
    for line in ("BindsTo=dev-%i.device", "After=dev-%i.device", "SupplementaryGroups=dialout",
                 "DeviceAllow=/dev/%I rw", "--serial /dev/%I"):
        assert line in serial_unit, line
    assert (tmp_path / "etc/edgellama/serial.toml").is_file()
    rule = (Path(__file__).resolve().parent.parent / "systemd/99-edgellama-serial.rules").read_text()
    assert 'ENV{SYSTEMD_WANTS}+="edgellama-serial@%k.service"' in rule and 'TAG+="systemd"' in rule


@needs_systemd
def test_service_security_exposure_at_most_1_5(tmp_path: Path) -> None:
    units = _install(tmp_path)
    r = subprocess.run(["systemd-analyze", "security", "--offline=yes", "edgellama.service"], cwd=units,
                       capture_output=True, text=True, check=False)
    m = re.search(r"Overall exposure level for edgellama.service: ([0-9.]+) (\w+)", r.stdout)
    assert m, r.stdout + r.stderr
    print(f"\nsystemd-analyze security --offline=yes edgellama.service: {m.group(1)} {m.group(2)}")
    assert float(m.group(1)) <= 1.5


def _security_rows(units: Path) -> tuple[dict[str, str], float]:
    r = subprocess.run(["systemd-analyze", "security", "--offline=yes", "edgellama.service"], cwd=units,
                       capture_output=True, text=True, check=False)
    m = re.search(r"Overall exposure level for edgellama.service: ([0-9.]+)", r.stdout)
    assert m, r.stdout + r.stderr
    rows = {}
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) > 1 and parts[0] in ("✓", "✗"):
            rows[parts[1]] = parts[0]
    return rows, float(m.group(1))


@needs_systemd
def test_tcp_drop_in_verifies_and_relaxes_only_the_network(tmp_path: Path) -> None:
    plain, _ = _security_rows(_install(tmp_path / "plain"))
    r = subprocess.run([sys.executable, "-m", "edgellama.cli", "install-service", "--root", str(tmp_path / "tcp"),
                        "--tcp"], capture_output=True, text=True, env=cli_env(), check=True)
    units = tmp_path / "tcp/etc/systemd/system"
    assert (units / "edgellama.service.d/edgellama-tcp.conf").is_file(), r.stdout
    # systemd-analyze reads the drop-in directory beside the unit: an unknown key there would be reported
    v = subprocess.run(["systemd-analyze", "verify", "edgellama.service"], cwd=units, capture_output=True,
                       text=True, check=False)
    assert v.returncode == 0 and not v.stderr.strip() and not v.stdout.strip(), (v.stdout, v.stderr)
    tcp, exposure = _security_rows(units)
    changed = {k for k in plain.keys() | tcp.keys() if plain.get(k) != tcp.get(k)}
    assert changed == {"PrivateNetwork=", "RestrictAddressFamilies=~AF_(INET|INET6)", "IPAddressDeny="}, changed
    assert tcp["PrivateNetwork="] == "✗" and exposure <= 1.5


def test_default_config_parses_and_the_command_line_wins(gemma_path: Path, tmp_path: Path) -> None:
    conf = tmp_path / "edgellama.toml"
    shipped = (Path(__file__).resolve().parent.parent / "systemd/edgellama.toml").read_text()
    conf.write_text(shipped + '\nctx-size = 128\nqueue = 1\nlog_format = "json"\n')
    log = tmp_path / "serve.log"
    srv = ServerProc("-m", str(gemma_path), "--config", str(conf), "--log-file", str(log))  # FAST has -c 256
    try:
        srv.wait_ready()
        h = srv.health()
        assert h["n_ctx"] == 256 and h["queue_max"] == 1  # -c from the command line, queue from the file
        first = [json.loads(line) for line in log.read_text().splitlines()]
        assert first[0]["msg"] == "listening"
        # logrotate's move, then SIGHUP: the server writes to a new file at the old name
        log.rename(tmp_path / "serve.log.1")
        srv.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while not log.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        with srv.connect() as c:
            c.ask({"id": "after-hup", "prompt": "Hi", "n_predict": 1})
        assert srv.terminate() == 0
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        assert any(x.get("id") == "after-hup" for x in lines)
        assert "after-hup" not in (tmp_path / "serve.log.1").read_text()
    finally:
        srv.kill()


@pytest.mark.parametrize(("line", "words"), [("queue = \"many\"", "queue"), ("no_such_flag = 1", "unknown key"),
                                              ("log-prompts = 3", "true or false"), ("cache-type = \"q5\"", "one of")])
def test_bad_config_is_one_line_error(tmp_path: Path, line: str, words: str) -> None:
    conf = tmp_path / "bad.toml"
    conf.write_text(line + "\n")
    r = subprocess.run([sys.executable, "-m", "edgellama.cli", "serve", "--config", str(conf), "--socket",
                        str(tmp_path / "s")], capture_output=True, text=True, env=cli_env(), check=False,
                       timeout=60)
    assert r.returncode == 1 and words in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_journald_priority_prefixes_and_json_fields_with_log_prompts(gemma_path: Path) -> None:
    srv = ServerProc("-m", str(gemma_path), "--log-format", "json", "--log-prompts", journal=True)
    try:
        srv.wait_ready()
        with srv.connect() as c:
            events = c.ask({"id": "logged", "prompt": "Say yes", "n_predict": 2})
        assert srv.terminate() == 0
        lines = srv.stderr().splitlines()
        assert lines and all(line.startswith("<6>") for line in lines), lines
        req = next(json.loads(line[3:]) for line in lines if '"logged"' in line)
        assert req["prompt"] == "Say yes" and req["output"] == text_of(events)
        assert req["n_prompt"] >= 3 and req["n_predicted"] == 2 and "queue_ms" in req and req["slot"] == 0
    finally:
        srv.kill()
