"""The supervisor behind `edgellama serve`: protocol v1 over a UNIX socket, one engine thread.

One concern a module: transport (socket, connections, framing), protocol (requests and events),
scheduler (the engine thread and its queue), metrics, systemd (sd_notify, LISTEN_FDS), config
(TOML), logs, server (wires them together on one asyncio loop).
"""
