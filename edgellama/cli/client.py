"""`edgellama client`: the reference client of `edgellama serve`. Sends one prompt (or chat turn)
from the command line or stdin, streams the answer to stdout; `--json` prints the raw events.

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


def client(args: argparse.Namespace) -> int:
    path = args.socket or default_socket()
    if args.health or args.metrics:
        req: dict[str, Any] = {"type": "health" if args.health else "metrics", "id": "c"}
    else:
        text = args.prompt if args.prompt is not None else sys.stdin.read()
        if not text:
            raise ValueError("no prompt: give it as an argument or on stdin")
        req = build_request(args, text)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(args.timeout)
    try:
        sock.connect(path)
    except OSError as exc:
        print(f"edgellama: cannot connect to {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    out = sys.stdout
    with sock, sock.makefile("rb") as reader:
        sock.sendall((json.dumps(req) + "\n").encode())
        while True:
            try:
                line = reader.readline()
            except TimeoutError:
                print(f"edgellama: no answer within {args.timeout} s", file=sys.stderr)
                return 1
            if not line:
                print("edgellama: the server closed the connection", file=sys.stderr)
                return 1
            ev = json.loads(line)
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
