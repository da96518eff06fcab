"""Which route answers a method and path, and which protocol a UNIX socket connection speaks: its
first byte decides (an HTTP method starts with a capital letter; protocol v1 lines with `{`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import h11

from edgellama.service.http import embedding_routes as E
from edgellama.service.http import llama_routes as L
from edgellama.service.http import model_routes as M
from edgellama.service.http import openai_routes as O
from edgellama.service.http.connection import HttpConnection, Route
from edgellama.service.http.fields import HttpError

ROUTES: dict[str, dict[str, Route]] = {
    "/health": {"GET": L.health}, "/v1/health": {"GET": L.health},
    "/metrics": {"GET": L.metrics},
    "/props": {"GET": L.props},
    "/slots": {"GET": L.get_slots},
    "/completion": {"POST": L.completion}, "/completions": {"POST": L.completion},
    "/tokenize": {"POST": L.tokenize},
    "/detokenize": {"POST": L.detokenize},
    "/apply-template": {"POST": L.apply_template},
    "/lora-adapters": {"GET": L.get_lora_adapters, "POST": L.post_lora_adapters},
    "/v1/models": {"GET": M.models}, "/models": {"GET": M.models},
    "/models/load": {"POST": M.load}, "/models/unload": {"POST": M.unload},
    "/v1/completions": {"POST": O.completions},
    "/v1/chat/completions": {"POST": O.chat_completions}, "/chat/completions": {"POST": O.chat_completions},
    "/embedding": {"POST": E.embedding}, "/embeddings": {"POST": E.embedding},
    "/v1/embeddings": {"POST": E.v1_embeddings},
    "/rerank": {"POST": E.rerank}, "/reranking": {"POST": E.rerank},
    "/v1/rerank": {"POST": E.rerank}, "/v1/reranking": {"POST": E.rerank},
}


def route(method: str, path: str) -> Route:
    methods = ROUTES.get(path)
    if methods is None:
        return _raise(HttpError(404, f"File Not Found: {path}"))
    handler = methods.get(method)
    if handler is None:
        return _raise(HttpError(405, f"{method} is not allowed on {path} (use {', '.join(methods)})"))
    return handler


def _raise(exc: HttpError) -> Route:
    async def refuse(conn: HttpConnection, req: h11.Request, body: bytes) -> None:
        raise exc

    return refuse


def is_http(first: bytes) -> bool:
    return 0x41 <= first[0] <= 0x5A  # A-Z: GET, POST, ... (a JSON line starts with `{`)


class FirstBytes(asyncio.Protocol):
    """Holds a new UNIX socket connection until its first bytes, then hands it to the protocol they name."""

    def __init__(self, lines: Callable[[], asyncio.Protocol], http: Callable[[], asyncio.Protocol]) -> None:
        self.lines, self.http = lines, http
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        proto = self.http() if is_http(data) else self.lines()
        self.transport.set_protocol(proto)
        proto.connection_made(self.transport)
        proto.data_received(data)

    def eof_received(self) -> bool:
        return False  # closed before saying anything

    def connection_lost(self, exc: Exception | None) -> None:
        pass
