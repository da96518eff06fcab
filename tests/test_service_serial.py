"""`edgellama serve --serial` end to end: one real server process (SmolLM2) with four pty "devices"
(null-modem pairs of real ptys, pyserial on the client's end), a loop:// and a socket:// port, and its
UNIX socket alongside; wire faults, a stalled reader, and a device that vanishes and comes back."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from edgellama.service.serial_port import LineFramer
from tests.serial_util import NullModem
from tests.service_util import ServerProc, cli_env, text_of

MAX_TOKENS = 48
OVERFLOW_BUFFER = 64  # bytes of answer the stalled port may queue before its request is cancelled


@dataclass
class Rig:
    srv: ServerProc
    json_port: NullModem  # mode=json, opened through a symlink (the device-loss test moves it)
    link: Path
    chat_port: NullModem  # mode=text, chat
    auto_port: NullModem  # mode=auto, line-timeout 1
    flow_port: NullModem  # mode=text, xonxoff, a 64-byte buffer
    tcp: socket.socket  # the server's socket:// port, accepted here


@pytest.fixture(scope="module")
def rig(smollm2_path: Path) -> Iterator[Rig]:
    tmp = Path(tempfile.mkdtemp(prefix="elser", dir="/tmp"))
    modems = [NullModem() for _ in range(4)]
    link = tmp / "ttyJSON"
    link.symlink_to(modems[0].device.path)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(60)
    tcp_url = f"socket://127.0.0.1:{listener.getsockname()[1]}"
    srv = ServerProc("-m", str(smollm2_path), "--max-tokens", str(MAX_TOKENS), "--log-format", "json",
                     "--log-prompts",
                     "--serial", f"{link},mode=json",
                     "--serial", f"{modems[1].device.path},mode=text,chat",
                     "--serial", f"{modems[2].device.path},mode=auto,line-timeout=1",
                     "--serial", f"{modems[3].device.path},mode=text,xonxoff,buffer={OVERFLOW_BUFFER}",
                     "--serial", "loop://", "--serial", f"{tcp_url},mode=json")
    try:
        tcp, _ = listener.accept()
        tcp.settimeout(120)
        srv.wait_ready()
        yield Rig(srv, modems[0], link, modems[1], modems[2], modems[3], tcp)
        tcp.close()
    finally:
        srv.kill()
        listener.close()
        for m in modems:
            m.close()
        shutil.rmtree(tmp, ignore_errors=True)


class Client:
    """pyserial on the client's pty: JSON events or text replies."""

    def __init__(self, modem: NullModem, timeout: float = 120.0) -> None:
        self.ser = modem.open_client(timeout=timeout)

    def line(self) -> bytes:
        data = self.ser.readline()
        assert data.endswith(b"\n"), f"no complete line within the timeout: {data!r}"
        return data

    def events(self, req_id: Any) -> list[dict[str, Any]]:
        """JSON events until req_id's done or error (events of other ids are skipped)."""
        got = []
        while True:
            ev = json.loads(self.line())
            if ev.get("id") == req_id:
                got.append(ev)
                if ev["event"] in ("done", "error"):
                    return got

    def reply(self, line: bytes | None = None) -> list[str]:
        """Text mode: the reply lines, up to and including the end marker "." or an ERR line."""
        if line is not None:
            self.ser.write(line + b"\r\n")
        out = []
        while True:
            text = self.line().decode().removesuffix("\n").removesuffix("\r")
            out.append(text)
            if text == "." or text.startswith("ERR "):
                return out

    def close(self) -> None:
        self.ser.close()


def answer_text(reply: list[str]) -> str:
    """The answer in a text reply: lines before the marker, dot-stuffing undone."""
    assert reply[-1] == ".", reply
    return "\n".join(x[1:] if x.startswith("..") else x for x in reply[:-1])


def socket_answer(rig: Rig, prompt: str, n: int) -> str:
    with rig.srv.connect() as c:
        events = c.ask({"id": "s", "prompt": prompt, "n_predict": n, "temperature": 0})
    assert events[-1]["event"] == "done", events
    return text_of(events)


def log_requests(rig: Rig) -> list[dict[str, Any]]:
    return [r for r in rig.srv.records() if r.get("msg") == "request"]


def test_json_mode_answers_exactly_as_the_socket(rig: Rig) -> None:
    req = {"id": "j1", "prompt": "The capital of France is", "n_predict": 8, "temperature": 0}
    with rig.srv.connect() as c:
        on_socket = c.ask(req)
    port = Client(rig.json_port)
    try:
        port.ser.write((json.dumps(req) + "\n").encode())
        on_serial = port.events("j1")
        port.ser.write(b'{"id": "bad", "prompt": 3}\n{not json\n')
        assert json.loads(port.line())["code"] == "bad_request"
        assert json.loads(port.line())["code"] == "bad_request"
    finally:
        port.close()
    strip = [{k: v for k, v in e.items() if k not in ("timings", "tokens_cached", "tokens_evaluated")}
             for e in on_socket]
    assert strip == [{k: v for k, v in e.items() if k not in ("timings", "tokens_cached", "tokens_evaluated")}
                     for e in on_serial]
    assert on_serial[-1]["stop_reason"] == "length" and on_serial[-1]["tokens_predicted"] == 8


def test_text_mode_streams_the_answer_and_ends_with_the_marker(rig: Rig) -> None:
    prompt = "The three primary colors are"
    expected = socket_answer(rig, prompt, 12)
    port = Client(rig.auto_port)
    try:
        assert port.reply(b"/set temperature 0") == ["OK temperature=0", "."]
        assert port.reply(b"/set n_predict 12") == ["OK n_predict=12", "."]
        assert port.reply(b"/set top_k -3")[0].startswith("ERR bad_request 'top_k' must be >= 0")
        health = port.reply(b"/health")
        assert health[0].startswith("OK status=ok slots=1") and health[1] == "."
        port.ser.write(prompt.encode() + b"\r")  # a terminal's Enter: CR alone
        reply = port.reply()
        port.reply(b"/set n_predict 40")
        port.ser.write(b"1, 2, 3, 4,\r\n")
        assert port.ser.read(1)  # the answer streams
        port.ser.write(b"/cancel\r\n")  # taken at once, not after the answer
        assert port.reply()[-1] == "ERR cancelled cancelled by /cancel"
        assert port.reply(b"/cancel") == ["ERR not_found no answer in progress to cancel"]
    finally:
        port.close()
    assert answer_text(reply).rstrip("\n") == expected.rstrip("\n") and expected.strip()


def test_chat_keeps_the_conversation_until_reset(rig: Rig) -> None:
    port = Client(rig.chat_port)
    try:
        port.reply(b"/set temperature 0")
        port.reply(b"/set n_predict 6")
        first = answer_text(port.reply(b"My name is Zorblax."))
        port.reply(b"What is my name?")
        assert port.reply(b"/reset") == ["OK conversation cleared", "."]
        port.reply(b"What is my name?")
    finally:
        port.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        turns = [r for r in log_requests(rig) if "What is my name?" in str(r.get("prompt"))]
        if len(turns) == 2:
            break
        time.sleep(0.1)
    assert len(turns) == 2, turns
    second, after_reset = turns
    # the second turn's prompt is the whole conversation: the first turn and the model's answer to it
    assert "My name is Zorblax." in second["prompt"] and first.strip() in second["prompt"]
    assert "Zorblax" not in after_reset["prompt"]
    assert second["n_prompt"] > after_reset["n_prompt"]
    assert second["port"] == after_reset["port"] == rig.chat_port.device.path.removeprefix("/dev/")


def test_wire_garbage_each_gets_an_error_line_and_the_port_goes_on(rig: Rig) -> None:
    rng = random.Random(18)
    noise = bytes(b for b in (rng.randrange(256) for _ in range(400)) if b not in b"\r\n\x11\x13{")
    with pytest.raises(UnicodeDecodeError):
        noise.decode()
    cases: list[tuple[bytes, str]] = [
        (noise + b"\n", "ERR bad_request the line is not valid utf-8"),
        (b"caf\xc3\x28 au lait\n", "ERR bad_request the line is not valid utf-8 (byte 3)"),
        (b"ab\x00\x00cd\n", "ERR bad_request the line holds control byte 0x00 at column 3"),
        (b"x" * (1 << 20) + b"\n", "ERR too_long line longer than 65536 bytes"),
        (b"half a li", "ERR bad_request half a line and then 1 s of silence"),  # then silence: --line-timeout 1
    ]
    port = Client(rig.auto_port)
    try:
        port.reply(b"/set n_predict 2")
        for data, expected in cases:
            port.ser.write(data)
            reply = port.reply()
            assert len(reply) == 1 and reply[0].startswith(expected), (data[:20], reply)
            assert port.reply(b"Hello")[-1] == "."  # a normal prompt right after is answered
        port.ser.write(b'{"id": 5, "prompt": "Hi", "n_predict": 1}\n')  # auto: a { line is protocol v1
        assert port.events(5)[-1]["event"] == "done"
    finally:
        port.close()
    m = rig.srv.metrics()
    name = rig.auto_port.device.path.removeprefix("/dev/")
    for kind in ("too_long", "timeout"):
        assert m[f'edgellama:serial_wire_errors_total{{port="{name}",kind="{kind}"}}'] == 1


def test_break_and_framing_marks_are_counted_and_the_line_goes_on() -> None:
    # a pty cannot raise a break or a framing error; this is the PARMRK decoding the port applies to a
    # real UART's bytes: \xff\x00\x00 a break, \xff\x00 X a bad byte, \xff\xff a real 0xff
    f = LineFramer(max_line=64, parmrk=True)
    assert f.feed(b"garbled\xff\x00", 0.0) == []  # a mark split across two reads
    assert f.feed(b"\x00hello\n", 0.0) == [("break", b""), ("line", b"hello")]  # a break drops the half line
    assert f.feed(b"ab\xff\x00\x41cd\n", 0.0) == [("framing", b""), ("corrupt", b"a")]
    assert f.feed(b"\xff\xffok\r\n", 0.0) == [("line", b"\xffok")]
    assert f.feed(b"half", 1.0) == [] and f.expire(1.5, 1.0) == [] and f.expire(2.0, 1.0) == [("timeout", b"h")]
    assert f.feed(b"y" * 100, 3.0) == [("too_long", b"y")] and f.feed(b"y" * 10 + b"\nnext\n", 3.0) == [
        ("line", b"next")]


def test_a_stalled_reader_backs_up_only_its_own_stream(rig: Rig) -> None:
    prompt = {"prompt": "1, 2, 3, 4, 5,", "n_predict": 24, "temperature": 0}  # counts on: no early end
    with rig.srv.connect() as c:
        alone = c.ask({"id": "alone", **prompt})[-1]["timings"]["predicted_per_second"]
    port = Client(rig.flow_port)
    try:
        port.reply(b"/set n_predict 48")
        port.reply(b"/set temperature 0")  # greedy counting: well past 64 bytes before any end
        port.ser.write(b"\x13One, two, three, four,\r\n")  # XOFF, then the prompt
        time.sleep(0.5)  # the serial request holds the slot; its reader takes nothing
        with rig.srv.connect() as c:
            done = c.ask({"id": "beside", **prompt})[-1]
        assert done["event"] == "done" and done["tokens_predicted"] == 24
        # generous: the point is that the stalled port does not hold the engine (it would wait forever)
        assert done["timings"]["predicted_per_second"] > 0.3 * alone, (done, alone)
        assert port.ser.in_waiting == 0  # the serial reader is still held by XOFF
        port.ser.write(b"\x11")  # XON: the buffered part of the answer, then why it was cut
        reply = port.reply()
        assert reply[-1].startswith("ERR cancelled the reader of") and "fell 64 bytes behind" in reply[-1], reply
        assert port.reply(b"/set n_predict 2") and port.reply(b"Hello")[-1] == "."
    finally:
        port.close()
    assert '"msg": "serial output backed up"' in rig.srv.stderr()


def test_two_ports_and_the_socket_at_once(rig: Rig) -> None:
    results: dict[str, Any] = {}

    def on_json() -> None:
        port = Client(rig.json_port)
        try:
            port.ser.write(b'{"id": "both", "prompt": "One, two,", "n_predict": 4, "temperature": 0}\n')
            results["json"] = port.events("both")[-1]
        finally:
            port.close()

    def on_text() -> None:
        port = Client(rig.auto_port)
        try:
            port.reply(b"/set n_predict 4")
            results["text"] = port.reply(b"Red, green,")
        finally:
            port.close()

    def on_tcp() -> None:
        rig.tcp.sendall(b'{"id": "tcp", "prompt": "A, B,", "n_predict": 3}\n')
        with rig.tcp.makefile("rb") as r:
            while True:
                ev = json.loads(r.readline())
                if ev["event"] in ("done", "error"):
                    results["tcp"] = ev
                    return

    threads = [threading.Thread(target=f) for f in (on_json, on_text, on_tcp)]
    for t in threads:
        t.start()
    with rig.srv.connect() as c:
        results["socket"] = c.ask({"id": "sock", "prompt": "X, Y,", "n_predict": 3})[-1]
    for t in threads:
        t.join(300)
    assert results["json"]["tokens_predicted"] == 4 and results["text"][-1] == "."
    assert results["tcp"]["event"] == results["socket"]["event"] == "done"
    m = rig.srv.metrics()
    assert m['edgellama:serial_port_up{port="loop://"}'] == 1  # loop:// opened through serial_for_url


def test_device_loss_reconnects_and_the_socket_is_unaffected(rig: Rig) -> None:
    port = Client(rig.json_port)
    name = rig.link.name
    try:
        port.ser.write(b'{"id": "cut", "prompt": "Once upon a time", "n_predict": 40}\n')
        assert json.loads(port.line())["event"] == "token"  # mid-stream
        rig.link.unlink()  # the adapter is pulled: the path vanishes and the pty hangs up
        old = rig.json_port.replace_device()
        old.close()
        with rig.srv.connect() as c:  # the socket serves while the port is gone
            assert c.ask({"id": "during", "prompt": "Hi", "n_predict": 3})[-1]["event"] == "done"
        deadline = time.monotonic() + 30
        while rig.srv.metrics()[f'edgellama:serial_port_up{{port="{name}"}}'] == 1:
            assert time.monotonic() < deadline, "the lost device was not noticed"
            time.sleep(0.1)
        rig.link.symlink_to(rig.json_port.device.path)  # plugged back, at the same path
        port.ser.reset_input_buffer()
        port.ser.write(b'{"type": "health", "id": "h"}\n')
        port.ser.timeout = 1
        deadline = time.monotonic() + 60
        while True:  # lines sent before the reopen are lost with the old device: ask until answered
            line = port.ser.readline()
            if line and json.loads(line).get("id") == "h":
                break
            assert time.monotonic() < deadline, "no reconnect"
            port.ser.write(b'{"type": "health", "id": "h"}\n')
        port.ser.timeout = 120
        port.ser.write(b'{"id": "after", "prompt": "Hi", "n_predict": 3, "temperature": 0}\n')
        assert port.events("after")[-1]["event"] == "done"
    finally:
        port.close()
    m = rig.srv.metrics()
    assert m[f'edgellama:serial_reconnects_total{{port="{name}"}}'] == 1
    assert m[f'edgellama:serial_port_up{{port="{name}"}}'] == 1
    assert '"msg": "serial port lost; reopening with backoff"' in rig.srv.stderr()


def test_client_command_over_serial_in_both_modes(rig: Rig) -> None:
    expected = socket_answer(rig, "Green, blue,", 4)
    for modem, mode in ((rig.json_port, "json"), (rig.auto_port, "text")):
        r = subprocess.run([sys.executable, "-m", "edgellama.cli", "client", "--serial", modem.client.path,
                            "--serial-mode", mode, "-n", "4", "--temp", "0", "Green, blue,"],
                           capture_output=True, text=True, env=cli_env(), timeout=120, check=False)
        assert r.returncode == 0, r.stderr
        assert r.stdout.rstrip("\n") == expected.rstrip("\n"), (mode, r.stdout, expected)


def _serve_error(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "edgellama.cli", "serve", *args, "-m", os.devnull],
                       capture_output=True, text=True, env=cli_env(), timeout=60, check=False)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, (args, r.stderr)
    return r.stderr


def test_bad_serial_settings_are_one_line_errors(tmp_path: Path) -> None:
    for spec, words in (("/dev/ttyUSB0,mode=binary", "mode must be one of"), ("/dev/ttyUSB0,speed=9600",
                        "unknown setting 'speed'"), ("nosuch://x", "nosuch"), ("/dev/ttyUSB0,baud=x", "not a number"),
                        ("/dev/ttyUSB0,parity=Q", "parity must be one of")):
        assert words in _serve_error("--serial", spec), spec
    conf = tmp_path / "serial.toml"  # the shipped serial.toml with a list of ports, as a TOML array
    shipped = (Path(__file__).resolve().parent.parent / "systemd/serial.toml").read_text()
    conf.write_text(shipped + 'serial = ["loop://", "/dev/ttyUSB0,mode=binary"]\n')
    assert "mode must be one of" in _serve_error("--config", str(conf))
    conf.write_text(shipped + 'serial = ["loop://"]\n')  # valid: the next thing refused is the model
    assert "model path is not a file" in _serve_error("--config", str(conf))


def test_serial_only_without_a_socket_and_a_clean_stop(smollm2_path: Path) -> None:
    modem = NullModem()
    srv = ServerProc(argv=[sys.executable, "-m", "edgellama.cli", "serve", "-m", str(smollm2_path), "-c", "128",
                           "-t", "1", "--serial", modem.device.path, "--serial-mode", "text", "--eol", "lf",
                           "--end-marker", "EOT"])
    try:
        port = Client(modem, timeout=1)
        try:
            deadline = time.monotonic() + 120
            line = b""
            while not line:  # until the port is open (lines before it are flushed by the open)
                assert time.monotonic() < deadline and srv.proc.poll() is None, srv.stderr()
                port.ser.write(b"/health\n")
                line = port.ser.readline()
            assert line.startswith(b"OK status=") and port.line() == b"\x04\n"  # the EOT marker, lf line ends
        finally:
            port.close()
        assert srv.terminate() == 0
        assert "listening" not in srv.stderr() and "serial port open" in srv.stderr()
    finally:
        srv.kill()
        modem.close()
