"""The UNIX socket and its connections: one asyncio protocol object per client that frames
request lines (with the --max-line bound) and writes event lines.

Framing only: what a line means is the server's business, and a bad line never closes a connection.
"""

from __future__ import annotations

import asyncio
import errno
import os
import select
import socket
import stat
from pathlib import Path
from typing import Any, Protocol

from edgellama.service import protocol as P
from edgellama.service.systemd import listen_fds


class LineHandler(Protocol):
    def handle_line(self, conn: Connection, line: bytes) -> None: ...
    def connection_gone(self, conn: Connection) -> None: ...
    def connection_opened(self, conn: Connection) -> None: ...


def listening_socket(path: str, mode: int) -> tuple[socket.socket, bool]:
    """The socket systemd passed (LISTEN_FDS), else a new one bound at path; and whether we created it
    (then we remove it at exit). A live socket at path is never taken over."""
    fds = listen_fds()
    if fds:
        sock = socket.socket(fileno=fds[0])
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
            raise ValueError("the socket passed by systemd (LISTEN_FDS) is not a UNIX stream socket")
        sock.setblocking(False)
        return sock, False
    p = Path(path)
    if len(os.fsencode(path)) >= 108:
        raise ValueError(f"socket path too long for AF_UNIX (max 107 bytes): {path}")
    if not p.parent.is_dir():
        raise FileNotFoundError(f"socket directory does not exist: {p.parent}")
    if p.exists() or p.is_symlink():
        if not stat.S_ISSOCK(p.lstat().st_mode):
            raise FileExistsError(f"{path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError as exc:
            if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                raise
            p.unlink()  # a stale socket left by a crash
        else:
            raise FileExistsError(f"another server is listening on {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o777 & ~mode)  # no window in which the socket is wider open than mode
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    os.chmod(path, mode)
    sock.listen(128)
    sock.setblocking(False)
    return sock, True


def peer_closed(transport: asyncio.BaseTransport | None) -> bool:
    """True when the peer closed both directions (POLLHUP), not just its sending side."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return True
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLOUT)
    return any(ev & (select.POLLHUP | select.POLLERR) for _, ev in poller.poll(0))


class Connection(asyncio.Protocol):
    port_name: str | None = None  # a socket client, not a serial port (the server's Client)

    def __init__(self, handler: LineHandler, max_line: int) -> None:
        self.handler = handler
        self.max_line = max_line
        self.buf = bytearray()
        self.discarding = False  # inside an over-long line: drop bytes up to its newline
        self.transport: asyncio.Transport | None = None
        self.inflight: dict[str | int, Any] = {}  # request id -> job
        self.closed = False
        self.eof = False  # the client half-closed: answer what is in flight, then close

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.handler.connection_opened(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while not self.closed:
            nl = self.buf.find(b"\n")
            if self.discarding:
                if nl < 0:
                    self.buf.clear()
                    return
                del self.buf[:nl + 1]
                self.discarding = False
                continue
            if nl < 0:
                if len(self.buf) > self.max_line:
                    self._too_long()
                    self.buf.clear()
                    self.discarding = True
                return
            line = bytes(self.buf[:nl]).rstrip(b"\r")
            del self.buf[:nl + 1]
            if len(line) > self.max_line:
                self._too_long()
            elif line.strip():
                self.handler.handle_line(self, line)

    def _too_long(self) -> None:
        self.send(P.error_event(None, P.TOO_LONG, f"request line longer than --max-line {self.max_line} bytes"))

    def eof_received(self) -> bool:
        self.eof = True
        # a last request line without its newline is still a request (the line ends where the input does)
        if not self.discarding and bytes(self.buf).strip():
            self.buf += b"\n"
            self.data_received(b"")
        # a half-closed client still reads its answers; one that closed outright is gone: returning
        # False closes the transport, and connection_lost cancels its requests now, queued ones too
        return bool(self.inflight) and not self._peer_closed()

    def _peer_closed(self) -> bool:
        return peer_closed(self.transport)

    def send(self, event: dict[str, Any]) -> None:
        if not self.closed and self.transport is not None and not self.transport.is_closing():
            self.transport.write(P.encode(event))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.handler.connection_gone(self)
