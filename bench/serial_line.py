"""`edgellama serve --serial` speed (issue 18): the serial path's time to first answer byte against the
socket's time to first token, and the bytes/s an answer puts on the line against a 115200-baud line.

Usage: python bench/serial_line.py [-m MODEL] [-c 256] [-t 1] [-n 64] [--repeats 7] [--baud 115200]

A pty has no baud rate (it moves bytes at memory speed), so the line is not simulated: the script
measures the bytes the port writes and the time they take, and divides by the line's capacity
(baud / 10 bytes/s for 8N1: a start bit, 8 data bits, a stop bit; 11520 B/s at 115200). What the wire
adds on a real UART is computed the same way: the first answer byte needs 10/baud s more.
- ttft: the same raw prompt (cached after the first run, so the figure is the path, not the prompt),
  one token, greedy; socket requests, serial JSON lines and serial text lines alternated `--repeats`
  times (medians): client time from writing the request line to the first token event (socket, JSON)
  or to the first answer byte (text mode).
- line: an answer of n tokens in text and in JSON mode: bytes on the line from the first to the last
  byte, their rate, and that rate as a share of the line's capacity."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tests.serial_util import NullModem
from tests.service_util import Conn, ServerProc

PROMPT = "The history of the bicycle begins in the early nineteenth century, when"


def socket_ttft(c: Conn, i: int) -> float:
    t0 = time.perf_counter()
    c.send({"id": i, "prompt": PROMPT, "n_predict": 1, "temperature": 0})
    ev = c.event()
    t = time.perf_counter() - t0
    assert ev["event"] == "token", ev
    c.until_final({i})
    return t


def json_ttft(ser: Any, i: int) -> float:
    line = (json.dumps({"id": i, "prompt": PROMPT, "n_predict": 1, "temperature": 0}) + "\n").encode()
    t0 = time.perf_counter()
    ser.write(line)
    ev = json.loads(ser.readline())
    t = time.perf_counter() - t0
    assert ev["event"] == "token", ev
    while json.loads(ser.readline())["event"] != "done":
        pass
    return t


def text_until_marker(ser: Any) -> list[tuple[float, bytes]]:
    """(arrival time, line) up to the end marker."""
    got = []
    while True:
        line = ser.readline()
        got.append((time.perf_counter(), line))
        if line.rstrip(b"\r\n") == b"." or line.startswith(b"ERR ") or not line:
            return got


def text_ttft(ser: Any) -> float:
    t0 = time.perf_counter()
    ser.write(PROMPT.encode() + b"\r\n")
    first = ser.read(1)  # the first answer byte
    t = time.perf_counter() - t0
    assert first, "no answer byte"
    text_until_marker(ser)
    return t


def line_rate(ser: Any, mode: str, n: int) -> dict[str, float]:
    """Bytes/s of one n-token answer, first byte to last byte, as the client received them."""
    if mode == "text":
        ser.write(f"/set n_predict {n}\r\n".encode())
        text_until_marker(ser)
        ser.write(PROMPT.encode() + b"\r\n")
        t_first = None
        got = bytearray()
        while True:
            chunk = ser.read(max(1, ser.in_waiting))
            now = time.perf_counter()
            if t_first is None:
                t_first = now
            got += chunk
            if got.endswith(b"\r\n.\r\n") or not chunk:
                break
        t_last = now
        nbytes = len(got)
    else:
        ser.write((json.dumps({"id": "rate", "prompt": PROMPT, "n_predict": n, "temperature": 0}) + "\n").encode())
        t_first = None
        nbytes = 0
        while True:
            line = ser.readline()
            now = time.perf_counter()
            t_first = t_first or now
            nbytes += len(line)
            if b'"event":"done"' in line or not line:
                break
        t_last = now
    dur = t_last - (t_first or t_last)
    return {"bytes": nbytes, "seconds": dur, "bytes_per_s": nbytes / dur if dur else 0.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2-135m-instruct")
    ap.add_argument("-c", "--ctx-size", type=int, default=256)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-n", "--n-predict", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--baud", type=int, default=115200)
    args = ap.parse_args()
    capacity = args.baud / 10  # 8N1
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}  line: {args.baud} baud 8N1 = "
          f"{capacity:.0f} B/s")
    modem = NullModem()
    srv = ServerProc("-m", args.model, "--serial", f"{modem.device.path},mode=auto", "--max-tokens",
                     str(max(args.n_predict, 8)), engine=["-c", str(args.ctx_size), "-t", str(args.threads)], nice=0)
    try:
        srv.wait_ready()
        ser = modem.open_client(timeout=120)
        ser.write(b"/set temperature 0\r\n/set n_predict 1\r\n")
        text_until_marker(ser)
        text_until_marker(ser)
        with srv.connect() as c:
            socket_ttft(c, 0)  # warm: the prompt in the cache
            ttft: dict[str, list[float]] = {"socket": [], "serial json": [], "serial text": []}
            for i in range(args.repeats):
                ttft["socket"].append(socket_ttft(c, i + 1))
                ttft["serial json"].append(json_ttft(ser, i + 1))
                ttft["serial text"].append(text_ttft(ser))
        base = statistics.median(ttft["socket"])
        print(f"\nfirst token / first answer byte, prompt cached, median of {args.repeats}:")
        for name, xs in ttft.items():
            extra = (statistics.median(xs) - base) * 1000
            print(f"  {name:12} {statistics.median(xs) * 1000:7.2f} ms  (min {min(xs) * 1000:.2f}, max "
                  f"{max(xs) * 1000:.2f})  vs socket {extra:+.2f} ms")
        wire_first = 10 / args.baud * 1000
        print(f"  on a real {args.baud}-baud line the first byte takes {wire_first:.3f} ms more on the wire")
        print(f"\nan answer of {args.n_predict} tokens on the line (capacity {capacity:.0f} B/s):")
        for mode in ("text", "json"):
            r = line_rate(ser, mode, args.n_predict)
            print(f"  {mode:5} {r['bytes']:6.0f} B in {r['seconds']:6.2f} s = {r['bytes_per_s']:7.1f} B/s, "
                  f"{100 * r['bytes_per_s'] / capacity:5.1f}% of the line; at {args.baud} baud it would take "
                  f"{r['bytes'] / capacity:.2f} s on the wire")
        ser.close()
        m = srv.metrics()
        name = modem.device.path.removeprefix("/dev/")
        label = '{port="' + name + '"}'
        print(f"\nport counters: received {m['edgellama:serial_received_bytes_total' + label]:.0f} B, "
              f"sent {m['edgellama:serial_sent_bytes_total' + label]:.0f} B")
    finally:
        srv.kill()
        modem.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
