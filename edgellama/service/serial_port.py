"""Serial ports of `edgellama serve --serial`: a pyserial port (a tty or a serial_for_url URL) that
frames request lines, survives wire faults and device loss, and acts as one client connection.

Framing and I/O only: a JSON line goes to the server as a socket's would, a text line to the port's
TextSession (serial_text.py). Blocking reads and writes live in this port's own two threads, so a
stalled or vanished wire never holds the engine thread or the asyncio loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import select
import termios
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from edgellama.service import protocol as P
from edgellama.service.serial_config import PortConfig
from edgellama.service.serial_text import TextSession

log = logging.getLogger("edgellama.service")

MODES = ("json", "text", "auto")
PARITIES = ("N", "E", "O", "M", "S")
STOPBITS = ("1", "1.5", "2")
EOLS = {"crlf": "\r\n", "lf": "\n"}
BACKOFF_MIN, BACKOFF_MAX = 0.1, 5.0  # seconds between reopen attempts of a lost device
STABLE = 10.0  # seconds a reopened device must stay up before a loss starts the backoff over
READ_TICK = 0.05  # a read returns at least this often, to expire half lines and see stop()
WRITE_CHUNK = 256  # bytes handed to one write(): what is counted as still buffered while it blocks


# --serial DEVICE,key=value,...: the keys a port may set for itself (the rest come from the flags)
_BOOL = {"1": True, "yes": True, "on": True, "true": True, "0": False, "no": False, "off": False, "false": False}


def _convert(key: str, value: str) -> Any:
    try:
        if key in ("baud", "bytesize", "buffer"):
            return int(value)
        if key == "line_timeout":
            return float(value)
    except ValueError:
        raise ValueError(f"--serial: {key}={value!r} is not a number") from None
    if key in ("rtscts", "xonxoff", "chat"):
        if value.lower() not in _BOOL:
            raise ValueError(f"--serial: {key}={value!r} must be on or off")
        return _BOOL[value.lower()]
    if key == "parity":
        return value.upper()
    return value


def parse_port(spec: str, defaults: PortConfig) -> PortConfig:
    """`DEVICE[,key=value...]` -> PortConfig (defaults from the flags); refuses unknown keys and values."""
    url, *opts = spec.split(",")
    if not url:
        raise ValueError(f"--serial {spec!r}: no device")
    fields = {f.name for f in dataclasses.fields(PortConfig)} - {"url", "max_line"}
    changes: dict[str, Any] = {"url": url}
    for opt in opts:
        key, eq, value = opt.partition("=")
        key = key.strip().replace("-", "_")
        if key == "mode" and not eq:
            raise ValueError(f"--serial {spec!r}: mode needs a value (json, text or auto)")
        if not eq and key in ("rtscts", "xonxoff", "chat"):
            value = "on"
        if key not in fields:
            raise ValueError(f"--serial {spec!r}: unknown setting {key!r} (one of {', '.join(sorted(fields))})")
        changes[key] = _convert(key, value)
    cfg = dataclasses.replace(defaults, **changes)
    check_port(cfg)
    return cfg


def check_port(cfg: PortConfig) -> None:
    """Each setting within what pyserial and the framing take, as a one-line error naming it."""
    where = f"--serial {cfg.url}"
    if cfg.mode not in MODES:
        raise ValueError(f"{where}: mode must be one of {', '.join(MODES)}")
    if cfg.eol not in EOLS:
        raise ValueError(f"{where}: eol must be crlf or lf")
    if cfg.parity not in PARITIES:
        raise ValueError(f"{where}: parity must be one of {', '.join(PARITIES)}")
    if cfg.stopbits not in STOPBITS:
        raise ValueError(f"{where}: stopbits must be 1, 1.5 or 2")
    if cfg.bytesize not in (5, 6, 7, 8):
        raise ValueError(f"{where}: bytesize must be 5, 6, 7 or 8")
    if not 50 <= cfg.baud <= 4_000_000:
        raise ValueError(f"{where}: baud {cfg.baud} is out of range (50..4000000)")
    if cfg.line_timeout < 0:
        raise ValueError(f"{where}: line-timeout must be >= 0 (0: never)")
    if cfg.buffer < 64:
        raise ValueError(f"{where}: buffer must be >= 64 bytes")
    if not cfg.end_marker or any(c in cfg.end_marker for c in "\r\n"):
        raise ValueError(f"{where}: end-marker must be a non-empty text without line breaks")
    try:
        "x".encode(cfg.encoding)
    except LookupError:
        raise ValueError(f"{where}: unknown encoding {cfg.encoding!r}") from None
    import serial

    try:  # pyserial's own checks of the URL scheme and the settings, without opening anything
        _configure(serial.serial_for_url(cfg.url, do_not_open=True), cfg)
    except (ValueError, serial.SerialException) as exc:
        raise ValueError(f"{where}: {exc}") from None


def _configure(ser: Any, cfg: PortConfig) -> Any:
    ser.baudrate = cfg.baud
    ser.bytesize = cfg.bytesize
    ser.parity = cfg.parity
    ser.stopbits = float(cfg.stopbits) if cfg.stopbits == "1.5" else int(cfg.stopbits)
    ser.rtscts = cfg.rtscts
    ser.xonxoff = cfg.xonxoff
    ser.timeout = READ_TICK
    ser.write_timeout = None  # the writer thread blocks; cancel_write() ends it
    return ser


def _mark_errors(ser: Any) -> bool:
    """On a tty, ask the line discipline to mark breaks and framing/parity errors in the data
    (PARMRK: \\xff\\x00\\x00 a break, \\xff\\x00 X a bad byte X, \\xff\\xff a real 0xff) instead of
    passing them as NULs; False for URL ports, which have no line discipline."""
    try:
        fd = ser.fileno()
        attrs = termios.tcgetattr(fd)
    except Exception:  # noqa: BLE001 - loop://, socket:// have no fd; a file or a socket is no tty
        return False
    attrs[0] |= termios.PARMRK | termios.INPCK
    attrs[0] &= ~(termios.IGNPAR | termios.IGNBRK | termios.BRKINT | termios.ISTRIP)
    termios.tcsetattr(fd, termios.TCSANOW, attrs)
    return True


class LineFramer:
    """Bytes off the wire -> events: ("line", bytes), ("too_long", first byte), ("break", b""),
    ("framing", b""), ("corrupt", first byte) for a line that held a framing error, ("timeout", first byte)
    for a half line older than the line timeout. Lines end at \\r or \\n (terminals send either); a line
    over max_line is refused at once and the rest of it dropped as it arrives, never held whole."""

    _EOL = re.compile(rb"[\r\n]")

    def __init__(self, max_line: int, parmrk: bool) -> None:
        self.max_line = max_line
        self.parmrk = parmrk
        self.buf = bytearray()
        self.first = b""  # first byte of the line in progress (auto mode's choice, kept when discarding)
        self.discarding = False
        self.corrupt = False
        self.mark = b""  # an unfinished PARMRK sequence from the previous read
        self.t_last = 0.0

    def feed(self, data: bytes, now: float) -> list[tuple[str, bytes]]:
        self.t_last = now
        events: list[tuple[str, bytes]] = []
        for kind, chunk in self._unmark(data):
            if kind == "data":
                self._split(chunk, events)
            elif kind == "break":  # a break resynchronises the line: the partial line is dropped
                events.append(("break", b""))
                self._reset()
            else:
                events.append(("framing", b""))
                if not self.discarding:
                    self.corrupt = True
                    self.first = self.first or b"?"
        return events

    def expire(self, now: float, timeout: float) -> list[tuple[str, bytes]]:
        """A half line silent for timeout seconds is dropped (an error event), so it cannot prefix the next."""
        if timeout <= 0 or now - self.t_last < timeout or not (self.buf or self.discarding or self.corrupt):
            return []
        first, half = self.first, bool(self.buf)
        self._reset()  # a refused long line or a lone bad byte was reported already: dropped quietly
        return [("timeout", first)] if half else []

    def _reset(self) -> None:
        self.buf.clear()
        self.first = b""
        self.discarding = self.corrupt = False

    def _unmark(self, data: bytes) -> list[tuple[str, bytes]]:
        if not self.parmrk or (not self.mark and b"\xff" not in data):
            return [("data", data)]
        out: list[tuple[str, bytes]] = []
        plain = bytearray()
        seq = self.mark + data
        self.mark = b""
        i = 0
        while i < len(seq):
            b = seq[i]
            if b != 0xFF:
                plain.append(b)
                i += 1
                continue
            if i + 1 >= len(seq) or (seq[i + 1] == 0 and i + 2 >= len(seq)):
                self.mark = bytes(seq[i:])  # the rest of the mark comes with the next read
                break
            if seq[i + 1] == 0xFF:
                plain.append(0xFF)
                i += 2
                continue
            if plain:
                out.append(("data", bytes(plain)))
                plain.clear()
            out.append(("break", b"") if seq[i + 2] == 0 else ("framing", b""))
            i += 3
        if plain:
            out.append(("data", bytes(plain)))
        return out

    def _split(self, data: bytes, events: list[tuple[str, bytes]]) -> None:
        pos = 0
        while pos < len(data):
            m = self._EOL.search(data, pos)
            end = m.start() if m else len(data)
            piece = data[pos:end]
            if piece and not self.first:
                self.first = piece[:1]
            if not self.discarding:
                if len(self.buf) + len(piece) > self.max_line:
                    events.append(("too_long", self.first))
                    self.buf.clear()
                    self.discarding = True
                else:
                    self.buf += piece
            if m is None:
                return
            pos = end + 1
            if not self.discarding and self.buf:
                events.append(("corrupt", self.first) if self.corrupt else ("line", bytes(self.buf)))
            elif self.corrupt and not self.discarding:
                events.append(("corrupt", self.first))
            self._reset()


class PortServer(Protocol):
    """What a port needs of the server: the same calls a socket connection makes."""

    metrics: Any

    def handle_line(self, conn: Any, line: bytes) -> None: ...
    def handle_request(self, conn: Any, obj: dict[str, Any]) -> None: ...
    def connection_gone(self, conn: Any) -> None: ...


class SerialPort:
    """One serial port as one client connection (inflight, send, close, like transport.Connection)."""

    def __init__(self, cfg: PortConfig, server: PortServer, loop: asyncio.AbstractEventLoop) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.server = server
        self.loop = loop
        self.metrics = server.metrics
        self.inflight: dict[str | int, Any] = {}
        self.eof = False  # a port never half-closes; the server's Connection contract
        self.closed = False
        self.text = TextSession(cfg, submit=self._submit_text, write=self._write)
        self.is_open = False  # loop side: between _opened and _lost
        self.orphans: set[Any] = set()  # ids of requests from before a device loss: their events are dropped
        self.overflowed: set[Any] = set()  # ids cancelled for a slow reader (logged once)
        self.out = bytearray()
        self.out_cond = threading.Condition()
        self.stopping = threading.Event()
        self.ser: Any = None
        self.thread = threading.Thread(target=self._supervise, name=f"edgellama-serial-{self.name}", daemon=True)

    @property
    def port_name(self) -> str:
        """The server's Client: the log names the port a request came from."""
        return self.name

    # ---- the asyncio loop's side ----
    def start(self) -> None:
        self.metrics.serial_up(self.name, False)
        self.thread.start()

    def send(self, event: dict[str, Any]) -> None:
        """An event of a request from this port: text for the text session's ids, else a JSON line."""
        req_id = event.get("id")
        final = event.get("event") in ("done", "error")
        owned = self.text.owns(req_id)
        if req_id in self.orphans:
            if final:
                self.orphans.discard(req_id)
            if owned:
                self.text.forget(event)
            return
        if final:
            self.overflowed.discard(req_id)
        if owned:
            self.text.on_event(event)
        else:
            self._write(P.encode(event), final=final, req_id=req_id)

    def close(self) -> None:
        """The server's Connection.close(): a port stays open (it has no peer that left)."""

    def _submit_text(self, obj: dict[str, Any]) -> None:
        self.server.handle_request(self, obj)

    def _write(self, data: bytes, final: bool = True, req_id: Any = None) -> None:
        """Queues bytes for the writer thread; never blocks. Past the port's buffer a request's further
        output is dropped and the request cancelled: a stalled reader backs up only its own stream."""
        if not self.is_open:
            return
        with self.out_cond:
            n_out = len(self.out)
            # once a request overflowed, none of its later output goes out: no gap in its stream
            over = not final and (req_id in self.overflowed or n_out + len(data) > self.cfg.buffer)
            # final lines (done, errors, replies) pass the bound, up to a hard cap: a sender that floods
            # bad lines at a reader that holds XOFF must not grow this buffer without end
            dropped = final and n_out + len(data) > 2 * self.cfg.buffer + 4096
            if not over and not dropped:
                self.out += data
                self.out_cond.notify()
        if over:
            self._overflow(req_id)
        elif dropped:
            self.metrics.serial_event(self.name, "output_dropped")

    def _overflow(self, req_id: Any) -> None:
        if req_id in self.overflowed:
            return
        self.overflowed.add(req_id)
        job = self.inflight.get(req_id) if req_id is not None else None
        reason = (f"the reader of {self.name} fell {self.cfg.buffer} bytes behind (flow control held or too slow a "
                  "reader): request cancelled")
        log.warning("serial output backed up", extra={"fields": {"port": self.name, "id": req_id,
                                                                  "buffered": len(self.out), "reason": reason}})
        self.metrics.serial_event(self.name, "output_overflow")
        self.text.note_cancel(req_id, reason)
        if job is not None and job.scheduler is not None:
            job.scheduler.cancel(job, "cancelled")

    def _on_wire(self, events: list[tuple[str, bytes]]) -> None:
        for kind, payload in events:
            if kind == "line":
                self._on_line(payload)
            elif kind in ("break", "framing"):
                self.metrics.serial_event(self.name, kind)
                log.info("serial line fault", extra={"fields": {"port": self.name, "kind": kind}})
            else:
                self.metrics.serial_event(self.name, kind)
                code = P.TOO_LONG if kind == "too_long" else P.BAD_REQUEST
                message = {
                    "too_long": f"line longer than {self.cfg.max_line} bytes (--max-line); the rest of it is dropped",
                    "corrupt": "the line had a framing or parity error on the wire; dropped",
                    "timeout": f"half a line and then {self.cfg.line_timeout:g} s of silence (--line-timeout); "
                               "dropped",
                }[kind]
                self._error(payload, code, message)

    def _error(self, first: bytes, code: str, message: str) -> None:
        self.metrics.outcome(code)
        if self._is_json(first):
            self._write(P.encode(P.error_event(None, code, message)))
        else:
            self.text.error(code, message)

    def _is_json(self, first: bytes) -> bool:
        return self.cfg.mode == "json" or (self.cfg.mode == "auto" and first == b"{")

    def _on_line(self, line: bytes) -> None:
        if not line.strip():
            return
        if self._is_json(line.lstrip()[:1]):
            self.server.handle_line(self, line)
        else:
            self.text.handle(line)

    def _opened(self, again: bool) -> None:
        self.is_open = True
        self.metrics.serial_up(self.name, True)
        if again:
            self.metrics.serial_event(self.name, "reconnect")
        log.info("serial port reopened" if again else "serial port open",
                 extra={"fields": {"port": self.name, "url": self.cfg.url, "baud": self.cfg.baud,
                                   "mode": self.cfg.mode}})

    def _lost(self, reason: str) -> None:
        was_open = self.is_open
        self.is_open = False
        self.metrics.serial_up(self.name, False)
        self.orphans.update(self.inflight)
        self.text.lost()
        self.server.connection_gone(self)  # cancels what this port had in flight, as a closed socket does
        if was_open and not self.stopping.is_set():
            log.warning("serial port lost; reopening with backoff", extra={"fields": {"port": self.name,
                                                                                      "error": reason}})

    # ---- the port's threads ----
    def stop(self, flush: float = 0.5) -> None:
        """Lets buffered output drain for up to flush seconds, then ends both threads (call off the loop)."""
        deadline = time.monotonic() + flush
        with self.out_cond:
            while self.out and self.ser is not None and time.monotonic() < deadline:
                self.out_cond.wait(0.02)
        self.stopping.set()  # the read and the write each wait at most a tick, then see it
        with self.out_cond:
            self.out_cond.notify_all()
        self.thread.join(5.0)

    def _open(self) -> Any:
        import serial

        ser = _configure(serial.serial_for_url(self.cfg.url, do_not_open=True), self.cfg)
        ser.open()
        return ser

    def _supervise(self) -> None:
        import serial

        delay, opened_before, warned = BACKOFF_MIN, False, False
        while not self.stopping.is_set():
            try:
                ser = self._open()
            except (serial.SerialException, OSError, ValueError) as exc:
                if not warned:  # once per outage; the attempts go on quietly with backoff
                    log.warning("serial port unavailable; retrying", extra={"fields": {"port": self.name,
                                                                                       "error": str(exc)}})
                    warned = True
                self.stopping.wait(delay)
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            t_open = time.monotonic()
            warned = False
            framer = LineFramer(self.cfg.max_line, _mark_errors(ser))
            with self.out_cond:
                self.out.clear()
            self.ser = ser
            self.loop.call_soon_threadsafe(self._opened, opened_before)
            opened_before = True
            writer = threading.Thread(target=self._write_loop, args=(ser,), name=f"edgellama-serial-w-{self.name}",
                                      daemon=True)
            writer.start()
            reason = "stopped"
            try:
                self._read_loop(ser, framer)
            except (serial.SerialException, OSError, termios.error) as exc:
                reason = str(exc) or type(exc).__name__
            finally:
                self.ser = None
                with self.out_cond:
                    self.out.clear()
                    self.out_cond.notify_all()
                writer.join(5.0)
                try:
                    ser.close()
                except Exception:  # noqa: BLE001, S110 - closing a vanished device may fail; it is gone either way
                    pass
            self.loop.call_soon_threadsafe(self._lost, reason)
            # a device that stays up a while gets the short delay again; one that flaps keeps backing off
            delay = BACKOFF_MIN if time.monotonic() - t_open > STABLE else min(delay * 2, BACKOFF_MAX)
            if not self.stopping.is_set():
                self.stopping.wait(delay)

    def _read_loop(self, ser: Any, framer: LineFramer) -> None:
        post: Callable[..., Any] = self.loop.call_soon_threadsafe
        while not self.stopping.is_set():
            waiting = ser.in_waiting
            data = ser.read(max(1, min(waiting, 65536)))
            now = time.monotonic()
            if data:
                self.metrics.serial_bytes(self.name, received=len(data))
                events = framer.feed(data, now)
            else:
                events = framer.expire(now, self.cfg.line_timeout)
            if events:
                post(self._on_wire, events)

    def _write_loop(self, ser: Any) -> None:
        while True:
            with self.out_cond:
                while not self.out and self.ser is ser and not self.stopping.is_set():
                    self.out_cond.wait(0.5)
                if self.ser is not ser or (self.stopping.is_set() and not self.out):
                    return
                chunk = bytes(self.out[:WRITE_CHUNK])
            try:
                n = self._write_some(ser, chunk)  # waits while flow control (RTS/CTS, XOFF) holds the line
            except Exception:  # noqa: BLE001 - the reader sees the lost device and reopens
                return
            self.metrics.serial_bytes(self.name, sent=n)
            with self.out_cond:
                del self.out[:n]
                self.out_cond.notify_all()

    def _write_some(self, ser: Any, chunk: bytes) -> int:
        """Bytes of chunk written. A tty is written by select + os.write: pyserial's own write spins on
        EAGAIN while flow control holds the line (a busy core on a small board)."""
        try:
            fd = ser.fileno()
        except Exception:  # noqa: BLE001 - URL ports (loop://, socket://) have no fd: their write does not spin
            n = ser.write(chunk)
            return len(chunk) if n is None else int(n)
        while self.ser is ser and not self.stopping.is_set():
            _, writable, _ = select.select([], [fd], [], 0.25)
            if writable:
                try:
                    return os.write(fd, chunk)
                except BlockingIOError:
                    continue
        return 0
