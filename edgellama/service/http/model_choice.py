"""Which of the service's models an HTTP request means, as llama-server's router reads it: the body's
`model` on POST endpoints, `?model=NAME` on GET ones; no name is the default model, an unknown one a 404
listing the names, a model that failed to load a 503 naming it."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

import h11

from edgellama.service import protocol as P
from edgellama.service.api import ModelView
from edgellama.service.http import fields as F
from edgellama.service.http.connection import HttpConnection


def query_model(req: h11.Request) -> str | None:
    """The `model` query parameter (llama-server's router: GET /props?model=NAME), None when absent."""
    target = req.target.decode("ascii", "replace")
    if "?" not in target:
        return None
    values = parse_qs(target.split("?", 1)[1]).get("model")
    return values[0] if values else None


def body_model(obj: dict[str, Any]) -> str | None:
    try:
        return P.model_name(obj.get("model"))
    except P.ProtocolError as exc:
        raise F.HttpError(400, str(exc)) from None


def model(conn: HttpConnection, name: str | None) -> ModelView:
    """The model a name means (None: the default); 404 listing the names for an unknown one."""
    try:
        return conn.service.model(name)
    except P.ProtocolError as exc:
        raise F.from_protocol_error(exc.code, str(exc)) from None


async def loaded(conn: HttpConnection, name: str | None) -> ModelView:
    """The model, loaded: several models: a load starts if it is not and this waits; one model: 503 while
    it loads."""
    try:
        m = await conn.service.loaded(name)
    except P.ProtocolError as exc:
        raise F.from_protocol_error(exc.code, str(exc)) from None
    if m.status != "ok":
        raise F.HttpError(503, "Loading model")
    return m


def choose(conn: HttpConnection, req: P.Completion | P.Embedding) -> str:
    """The model that answers req (an alias's pick by weight), written into req; its name for the answer."""
    try:
        req.model = conn.service.choose(req.model)
    except P.ProtocolError as exc:
        raise F.from_protocol_error(exc.code, str(exc)) from None
    return req.model


def choose_all(conn: HttpConnection, reqs: list[P.Completion]) -> str:
    """One model answers every request of one HTTP request (an alias picks it once); its name."""
    model = choose(conn, reqs[0])
    for r in reqs[1:]:
        r.model = model
    return model
