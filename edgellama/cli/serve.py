"""`edgellama serve`: the supervisor. Loads the model once and answers protocol v1 (newline-delimited
JSON, docs/protocol.md) and HTTP/1.1 (llama-server's and OpenAI's endpoints, docs/http.md) on a UNIX
socket, and protocol v1 or plain text on serial ports (docs/serial.md), as a systemd Type=notify service
or by hand; HTTP on TCP too with --http-port.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from edgellama.cli.common import add_model_args, check_model_args

DEFAULT_SOCKET = "/run/edgellama/edgellama.sock"


def _mode(s: str) -> int:
    try:
        m = int(s, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an octal mode such as 0660, got {s!r}") from None
    if not 0 <= m <= 0o777:
        raise argparse.ArgumentTypeError(f"mode out of range: {s!r}")
    return m


def add_parser(sub: Any) -> None:
    from edgellama.service import config

    p = sub.add_parser("serve", help="serve the model on a UNIX socket and serial lines (protocol v1, systemd-ready)",
                       description=__doc__)
    add_model_args(p, several=True)
    add_models_args(p)
    p.add_argument("--socket", default=None,
                   help=f"socket path (default {DEFAULT_SOCKET}, or none when --serial is given); a socket "
                        "passed by systemd (LISTEN_FDS) wins")
    p.add_argument("--socket-mode", type=_mode, default=0o660, help="permissions of a socket we create (octal)")
    p.add_argument("--parallel", "-np", type=int, default=None,
                   help="slots: requests decoded at once, in one forward pass per step (each slot has its own "
                        "KV cache of -c tokens: the memory plan counts them all); with --embedding also the texts "
                        "evaluated together (default: 1, with --embedding 4)")
    p.add_argument("--embedding", "--embeddings", action="store_true",
                   help="serve embeddings (/embedding, /v1/embeddings, protocol v1 `embedding`); the context then "
                        "defaults to 512 tokens per text (give -c for chat on the same model)")
    p.add_argument("--pooling", choices=("none", "mean", "cls", "last", "rank"), default=None,
                   help="with --embedding: how token vectors become one per text (default: the model's, else none); "
                        "rank: a reranker's scores (/rerank)")
    p.add_argument("--reranking", "--rerank", action="store_true",
                   help="serve /rerank with a reranker model: --embedding --pooling rank")
    p.add_argument("--queue", type=int, default=8, help="requests waiting for a slot before `busy` errors")
    p.add_argument("--max-tokens", type=int, default=512, help="most tokens one request may generate")
    p.add_argument("--max-line", type=int, default=65536,
                   help="longest request in bytes: a protocol v1 line or an HTTP request body")
    p.add_argument("--http-port", type=int, default=0,
                   help="also answer HTTP on TCP port N (default 0: off; the UNIX socket always answers HTTP)")
    p.add_argument("--host", default="127.0.0.1", help="address the --http-port listener binds (default %(default)s)")
    p.add_argument("--api-key", default=None,
                   help="key TCP clients must send as `Authorization: Bearer KEY` (visible in ps: prefer --api-key-file)")
    p.add_argument("--api-key-file", metavar="FILE", default=None,
                   help="file with the API key(s), one a line (blank lines and # comments ignored)")
    p.add_argument("--insecure-no-key", action="store_true",
                   help="serve --http-port without any API key (anyone who reaches the port may use the model)")
    p.add_argument("--http-header-timeout", type=float, default=10.0,
                   help="seconds an HTTP client has to send its request line and headers, and its body (slowloris)")
    p.add_argument("--system-prompt", metavar="FILE", default=None,
                   help="system prompt for chat requests without one; evaluated at start and kept cached")
    p.add_argument("--grace", type=float, default=0.0,
                   help="seconds in-flight requests may finish after SIGTERM before `shutdown` errors")
    p.add_argument("--log-format", choices=("text", "json"), default="text")
    p.add_argument("--log-file", default=None, help="log to FILE instead of stderr (reopened on SIGHUP)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    p.add_argument("--log-prompts", action="store_true", help="log prompts and outputs (off: counts only)")
    p.add_argument("--config", metavar="FILE", default=None,
                   help="TOML file with any of these flags as keys (e.g. ctx-size = 2048); the command line wins")
    add_serial_args(p)
    config.mark_defaults(p)
    p.set_defaults(handler=serve)


def add_models_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("several models (docs/models.md): -m NAME=FILE repeated, a request's `model` choosing "
                             "one; loaded on demand within --mem-budget (default: this machine's RAM)")
    g.add_argument("--models-dir", metavar="DIR", default=None,
                   help="serve every .gguf file in DIR, each named after its file (split models by their first piece)")
    g.add_argument("--default-model", metavar="NAME", default=None,
                   help="the model (or alias) of requests that name none (default: the first)")
    g.add_argument("--models-max", type=int, default=0,
                   help="at most N models loaded at once (default 0: as many as the memory budget holds)")
    g.add_argument("--keep-alive", metavar="DURATION", default="-1",
                   help="how long a model stays loaded after a request (seconds or 5m, 1h; -1: until it must "
                        "make room; 0: unloaded when idle); a request's `keep_alive` wins")
    g.add_argument("--alias", metavar="NAME=MODEL[:WEIGHT],...", action="append", default=[],
                   help="a name for a model, or for several, a request for it going to one by weight "
                        "(chat=v1:90,v2:10); repeatable; also an [aliases] table in --config")


def add_serial_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("serial ports (docs/serial.md); the flags are every port's defaults, "
                             "DEVICE,key=value,... sets one port's own (e.g. /dev/ttyUSB0,baud=9600,mode=text)")
    g.add_argument("--serial", metavar="DEVICE", action="append", default=[],
                   help="serve a serial device or pyserial URL (loop://, socket://HOST:PORT, rfc2217://HOST:PORT); "
                        "repeatable")
    g.add_argument("--baud", type=int, default=115200)
    g.add_argument("--bytesize", type=int, choices=(5, 6, 7, 8), default=8)
    g.add_argument("--parity", choices=("N", "E", "O", "M", "S"), default="N")
    g.add_argument("--stopbits", choices=("1", "1.5", "2"), default="1")
    g.add_argument("--rtscts", action="store_true", help="hardware flow control")
    g.add_argument("--xonxoff", action="store_true", help="software flow control")
    g.add_argument("--serial-mode", choices=("json", "text", "auto"), default="auto",
                   help="json: protocol v1; text: a line is a prompt; auto: a line starting with { is JSON")
    g.add_argument("--chat", action="store_true",
                   help="text mode: a line is a chat turn; the port keeps the conversation until /reset")
    g.add_argument("--eol", choices=("crlf", "lf"), default="crlf", help="text mode: line endings written")
    g.add_argument("--serial-encoding", default="utf-8", help="text mode: encoding of lines in and out")
    g.add_argument("--end-marker", default=".", help="text mode: the line that ends an answer (EOT: the byte 0x04)")
    g.add_argument("--line-timeout", type=float, default=10.0,
                   help="seconds of silence after which a half line is dropped with an error (0: never)")
    g.add_argument("--serial-buffer", type=int, default=16384,
                   help="bytes of answer queued for a port's reader; past it the request is cancelled")


def serial_ports(args: argparse.Namespace) -> list[Any]:
    """--serial specs with the flags as defaults -> checked PortConfigs (one-line errors)."""
    from edgellama.service.serial_config import PortConfig
    from edgellama.service.serial_port import parse_port

    base = PortConfig(url="-", baud=args.baud, bytesize=args.bytesize, parity=args.parity, stopbits=args.stopbits,
                      rtscts=args.rtscts, xonxoff=args.xonxoff, mode=args.serial_mode, chat=args.chat, eol=args.eol,
                      encoding=args.serial_encoding, end_marker=args.end_marker, line_timeout=args.line_timeout,
                      buffer=args.serial_buffer, max_line=args.max_line)
    ports = [parse_port(spec, base) for spec in args.serial]
    if not ports and args.chat:
        raise ValueError("--chat is a setting of --serial text-mode ports; give --serial DEVICE")
    names = [p.name for p in ports]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ValueError(f"--serial {dup} is given twice")
    return ports


def check(args: argparse.Namespace) -> None:
    """The service's own flags (each model's: check_model)."""
    if args.queue < 0:
        raise ValueError("--queue must be >= 0")
    if args.max_tokens < 1:
        raise ValueError("--max-tokens must be >= 1")
    if args.max_line < 256:
        raise ValueError("--max-line must be >= 256 bytes")
    if args.grace < 0:
        raise ValueError("--grace must be >= 0")
    if not 0 <= args.http_port <= 65535:
        raise ValueError("--http-port must be in 0..65535")
    if args.http_header_timeout <= 0:
        raise ValueError("--http-header-timeout must be > 0")
    if args.http_port and not (args.api_key or args.api_key_file or args.insecure_no_key):
        raise ValueError("--http-port needs --api-key KEY or --api-key-file FILE (or --insecure-no-key to serve "
                         "TCP clients without a key)")


def check_model(args: Any, where: str = "") -> None:
    """One model's flags (the service's, or a [models.NAME] table's over them: where names it)."""
    try:
        check_model_args(args)
        if args.reranking:
            if args.pooling not in (None, "rank"):
                raise ValueError(f"--reranking is --pooling rank, not --pooling {args.pooling}")
            args.embedding, args.pooling = True, "rank"
        if args.parallel is None:
            from edgellama.llm import EMBD_SEQS

            args.parallel = EMBD_SEQS if args.embedding else 1
        if args.pooling is not None and not args.embedding:
            raise ValueError("--pooling is a setting of --embedding")
        if not 1 <= args.parallel <= 256:
            raise ValueError("--parallel must be in 1..256")
        if args.parallel > 1 and args.numerics != "native":
            raise ValueError(f"--numerics {args.numerics} evaluates one sequence per forward pass (its bits are llama.cpp's "
                             "per sequence): use --parallel 1 with it")
        if args.parallel > args.batch_size:
            raise ValueError(f"--parallel {args.parallel} exceeds -b/--batch-size {args.batch_size}: a step carries "
                             f"one token of every slot")
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}" if where else str(exc)) from None


def models(args: argparse.Namespace) -> Any:
    """The models these flags serve (model_config.ModelsConfig), each checked, its system prompt read."""
    from pathlib import Path

    from edgellama.load_options import apply_file_defaults
    from edgellama.service.model_config import models_config

    cfg = models_config(args)
    for name, spec in cfg.models.items():
        apply_file_defaults(spec.opts, spec.ctx_given)  # an encoder serves embeddings, within its positions
        check_model(spec.opts, f"model {name}" if cfg.several else "")
        if spec.opts.system_prompt:
            spec.system_prompt = Path(spec.opts.system_prompt).read_text(encoding="utf-8")
    return cfg


def api_keys(args: argparse.Namespace) -> tuple[str, ...]:
    keys = [args.api_key] if args.api_key else []
    if args.api_key_file:
        from pathlib import Path

        try:
            text = Path(args.api_key_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"--api-key-file {args.api_key_file}: {exc.strerror or exc}") from None
        found = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        if not found:
            raise ValueError(f"--api-key-file {args.api_key_file} holds no key")
        keys += found
    return tuple(keys)


def serve(args: argparse.Namespace) -> int:
    from edgellama.memplan import parse_size, physical_memory
    from edgellama.service import config, logs
    from edgellama.service.scheduler import EngineConfig
    from edgellama.service.server import ServeOptions, Server

    config.merge(args)
    check(args)
    ports = serial_ports(args)
    cfg = models(args)  # a missing model is a one-line error now, not after the socket is up
    keys = api_keys(args) if args.http_port else ()
    handler = logs.setup(args.log_format, args.log_file, args.log_level)
    socket_path = args.socket or (None if ports else DEFAULT_SOCKET)
    budget = parse_size(args.mem_budget) if args.mem_budget else physical_memory()
    opts = ServeOptions(socket_path=socket_path, socket_mode=args.socket_mode, max_line=args.max_line,
                        grace=args.grace, log_prompts=args.log_prompts, serial=ports,
                        http_host=args.host, http_port=args.http_port, api_keys=keys,
                        header_timeout=args.http_header_timeout, budget=budget)
    engine = EngineConfig(max_tokens=args.max_tokens, queue=args.queue, log_prompts=args.log_prompts)
    server = Server(opts, cfg, engine, handler)
    if cfg.several:
        server.models.plan_all()  # a model that cannot fit even alone: refused now, by name, with its plan
    return asyncio.run(server.run())
