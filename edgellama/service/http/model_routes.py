"""The service's models over HTTP: GET /v1/models and /models (every configured model with its state, as
llama-server's router lists them), POST /models/load and /models/unload (its bodies: {"model": NAME}).
"""

from __future__ import annotations

from typing import Any

import h11

from edgellama.service import protocol as P
from edgellama.service.http import fields as F
from edgellama.service.http.connection import HttpConnection
from edgellama.service.http.model_choice import body_model, model


async def models(conn: HttpConnection, req: h11.Request, body: bytes) -> None:
    svc = conn.service
    data = []
    for info in svc.model_list():
        facts = svc.model(info.name).model_facts()
        meta = None
        if facts is not None:
            meta = {"n_vocab": facts.n_vocab, "n_ctx": facts.n_ctx, "n_ctx_train": facts.n_ctx_train,
                    "n_embd": facts.n_embd, "size": facts.size}
        entry: dict[str, Any] = {"id": info.name, "object": "model", "created": int(svc.started),
                                 "owned_by": "edgellama", "meta": meta}
        if svc.several:
            status: dict[str, Any] = {"value": info.state}
            if info.state == "failed":
                status |= {"failed": True, "reason": info.reason}
            entry |= {"path": info.path, "status": status, "aliases": info.aliases, "n_ctx": info.n_ctx,
                      "memory_plan_bytes": info.plan_bytes, "loads": info.loads}
        data.append(entry)
    conn.respond_json(200, {"object": "list", "data": data})


def _name(body: bytes) -> str:
    name = body_model(F.json_body(body))
    if name is None:
        raise F.HttpError(400, "field 'model' is required: the name of a configured model")
    return name


async def load(conn: HttpConnection, req: h11.Request, body: bytes) -> None:
    """POST /models/load: the model loads now (again, if it had failed); the answer does not wait for it."""
    name = model(conn, _name(body)).name
    try:
        conn.service.load_model(name)
    except P.ProtocolError as exc:
        raise F.from_protocol_error(exc.code, str(exc)) from None
    conn.respond_json(200, {"success": True})


async def unload(conn: HttpConnection, req: h11.Request, body: bytes) -> None:
    """POST /models/unload: unloads an idle model; 409 while a request runs or waits on it."""
    name = model(conn, _name(body)).name
    if not conn.service.unload_model(name):
        raise F.HttpError(409, f"model {name} has requests running or queued: it is not unloaded under them; "
                               "retry once they end")
    conn.respond_json(200, {"success": True})
