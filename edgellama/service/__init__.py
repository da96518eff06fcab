"""The supervisor behind `edgellama serve`: protocol v1 and HTTP/1.1 over a UNIX socket, one engine thread.

One concern a module: transport (socket, connections, framing), protocol (requests and events), http/
(HTTP/1.1 through h11: llama-server's and OpenAI's endpoints, mapped onto protocol v1 requests),
scheduler (the engine thread and its queue), metrics, systemd (sd_notify, LISTEN_FDS), config
(TOML), logs, server (wires them together on one asyncio loop).
"""
