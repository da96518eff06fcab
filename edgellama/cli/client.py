"""`edgellama client`: the reference client of `edgellama serve`. Sends one prompt (or chat turn)
from the command line or stdin, streams the answer to stdout; `--json` prints the raw events.
`--serial DEVICE` speaks to a serial port of the server instead (protocol v1, or text mode), for
testing a wire by hand.

Exit code: 0 answered (done), 1 no server or a broken connection, 3 the server refused the request
(an error event: bad_request, too_long, context, internal), 75 busy or shutting down (retry later).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from typing import Any

EXIT_REFUSED = 3
EXIT_TEMPFAIL = 75  # sysexits EX_TEMPFAIL: try again later


def default_socket() -> str:
    from edgellama.cli.serve import DEFAULT_SOCKET

    return os.environ.get("EDGELLAMA_SOCKET", DEFAULT_SOCKET)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("client", help="send a prompt to `edgellama serve` and stream the answer",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompt", nargs="?", default=None, help="prompt text (default: read stdin)")
    p.add_argument("--socket", default=None, help="server socket (default $EDGELLAMA_SOCKET or the service's)")
    p.add_argument("--chat", action="store_true", help="send the prompt as a user turn (the model's chat template)")
    p.add_argument("-sys", "--system", default=None, help="system message (with --chat)")
    p.add_argument("-n", "--n-predict", type=int, default=None)
    p.add_argument("--temp", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--min-p", type=float, default=None)
    p.add_argument("--repeat-penalty", type=float, default=None)
    p.add_argument("-s", "--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--json", action="store_true", help="print the server's events as JSON lines")
    p.add_argument("--health", action="store_true", help="print the server's health and exit")
    p.add_argument("--metrics", action="store_true", help="print the server's metrics (Prometheus text) and exit")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds without any event before giving up")
    g = p.add_argument_group("over a serial line (docs/serial.md)")
    g.add_argument("--serial", metavar="DEVICE", default=None,
                   help="a serial device or pyserial URL where `edgellama serve --serial` listens")
    g.add_argument("--serial-mode", choices=("json", "text"), default="json",
                   help="json: protocol v1 lines; text: the prompt as a line, the answer up to the end marker")
    g.add_argument("--baud", type=int, default=115200)
    g.add_argument("--rtscts", action="store_true")
    g.add_argument("--xonxoff", action="store_true")
    g.add_argument("--end-marker", default=".", help="text mode: the server's end marker (EOT: the byte 0x04)")
    p.set_defaults(handler=client)


def build_request(args: argparse.Namespace, text: str) -> dict[str, Any]:
    req: dict[str, Any] = {"id": f"client-{os.getpid()}"}
    if args.chat:
        msgs = [{"role": "system", "content": args.system}] if args.system else []
        req["messages"] = [*msgs, {"role": "user", "content": text}]
    else:
        if args.system:
            raise ValueError("--system needs --chat")
        req["prompt"] = text
    for flag, key in (("n_predict", "n_predict"), ("temp", "temperature"), ("top_k", "top_k"), ("top_p", "top_p"),
                      ("min_p", "min_p"), ("repeat_penalty", "repeat_penalty"), ("seed", "seed"), ("stop", "stop")):
        v = getattr(args, flag)
        if v is not None:
            req[key] = v
    return req


def _prompt_text(args: argparse.Namespace) -> str:
    text: str = args.prompt if args.prompt is not None else sys.stdin.read()
    if not text:
        raise ValueError("no prompt: give it as an argument or on stdin")
    return text


def client(args: argparse.Namespace) -> int:
    if args.serial is not None and args.serial_mode == "text":
        return text_client(args)
    if args.health or args.metrics:
        req: dict[str, Any] = {"type": "health" if args.health else "metrics", "id": "c"}
    else:
        req = build_request(args, _prompt_text(args))
    if args.serial is not None:
        try:
            ser = open_serial(args)
        except OSError as exc:  # pyserial's SerialException is an OSError
            print(f"edgellama: cannot open {args.serial}: {exc}", file=sys.stderr)
            return 1
        with ser:
            ser.write((json.dumps(req) + "\n").encode())
            return events(args, req, ser.readline, "the serial line")
    path = args.socket or default_socket()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(args.timeout)
    try:
        sock.connect(path)
    except OSError as exc:
        print(f"edgellama: cannot connect to {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    with sock, sock.makefile("rb") as reader:
        sock.sendall((json.dumps(req) + "\n").encode())
        return events(args, req, reader.readline, "the connection")


def open_serial(args: argparse.Namespace) -> Any:
    import serial

    ser = serial.serial_for_url(args.serial, do_not_open=True)
    ser.baudrate, ser.rtscts, ser.xonxoff, ser.timeout = args.baud, args.rtscts, args.xonxoff, args.timeout
    ser.open()
    return ser


def events(args: argparse.Namespace, req: dict[str, Any], readline: Any, what: str) -> int:
    """Reads protocol v1 events of req until its done (exit 0) or error; prints as the flags say."""
    out = sys.stdout
    while True:
        try:
            line = readline()
        except TimeoutError:
            print(f"edgellama: no answer within {args.timeout} s", file=sys.stderr)
            return 1
        if not line.endswith(b"\n"):  # a socket at EOF reads b"", a serial line at its timeout a part or b""
            print(f"edgellama: the server closed {what}" if what == "the connection"
                  else f"edgellama: no answer within {args.timeout} s", file=sys.stderr)
            return 1
        ev = json.loads(line)
        if ev.get("id") not in (req["id"], None):  # a serial line may carry leftovers of an earlier session
            continue
        if args.json:
            out.write(line.decode())
            out.flush()
        kind = ev.get("event")
        if kind == "token" and not args.json:
            out.write(ev["text"])
            out.flush()
        elif kind == "health" and not args.json:
            out.write(json.dumps(ev) + "\n")
        elif kind == "metrics" and not args.json:
            out.write(ev["text"])
        elif kind == "done" and not args.json:
            out.write(ev.get("content", "") + "\n")
            out.flush()
        elif kind == "error":
            print(f"edgellama: {ev['code']}: {ev['message']}", file=sys.stderr)
            return EXIT_TEMPFAIL if ev["code"] in ("busy", "shutdown") else EXIT_REFUSED
        if kind in ("done", "health", "metrics"):
            return 0


def text_client(args: argparse.Namespace) -> int:
    """Text mode: each sampling flag as a /set line, then the prompt line; prints the answer lines
    up to the end marker (dot-stuffing undone), or the ERR line on stderr."""
    if args.chat or args.system or args.json or args.metrics:
        raise ValueError("--chat, --system, --json and --metrics need --serial-mode json (in text mode the port's "
                         "own --chat decides)")
    lines = []
    for flag, key in (("n_predict", "n_predict"), ("temp", "temperature"), ("top_k", "top_k"), ("top_p", "top_p"),
                      ("min_p", "min_p"), ("repeat_penalty", "repeat_penalty"), ("seed", "seed")):
        v = getattr(args, flag)
        if v is not None:
            lines.append(f"/set {key} {json.dumps(v)}")
    if args.stop:
        lines.append(f"/set stop {json.dumps(args.stop)}")
    if args.health:
        lines.append("/health")
    else:
        prompt = " ".join(_prompt_text(args).split("\n")).strip()
        lines.append("/" + prompt if prompt.startswith("/") else prompt)
    marker = "\x04" if args.end_marker.upper() == "EOT" else args.end_marker
    try:
        ser = open_serial(args)
    except OSError as exc:
        print(f"edgellama: cannot open {args.serial}: {exc}", file=sys.stderr)
        return 1
    with ser:
        ser.reset_input_buffer()
        for i, line in enumerate(lines):
            ser.write(line.encode("utf-8") + b"\r\n")
            answer: list[str] = []
            while True:
                raw = ser.readline()
                if not raw.endswith(b"\n"):
                    print(f"edgellama: no answer within {args.timeout} s", file=sys.stderr)
                    return 1
                text = raw.decode("utf-8", "replace").rstrip("\r\n")
                if text == marker:
                    break
                if text.startswith("ERR "):
                    _, code, message = (text.split(" ", 2) + ["", ""])[:3]
                    print(f"edgellama: {code}: {message}", file=sys.stderr)
                    return EXIT_TEMPFAIL if code in ("busy", "shutdown") else EXIT_REFUSED
                answer.append(text[1:] if text.startswith(marker[0] * 2) else text)
            if i == len(lines) - 1:
                sys.stdout.write("\n".join(answer) + "\n")
    return 0
