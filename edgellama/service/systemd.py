"""systemd's two small protocols, written here without a C dependency: sd_notify (a datagram of
KEY=VALUE lines to $NOTIFY_SOCKET) and socket activation (listening fds from 3, $LISTEN_FDS/$LISTEN_PID).

Both are no-ops when the variables are absent, so the same binary runs by hand and under systemd.
"""

from __future__ import annotations

import os
import socket

SD_LISTEN_FDS_START = 3


class Notifier:
    """sd_notify(3): READY=1, STATUS=..., WATCHDOG=1, STOPPING=1."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        addr = env.get("NOTIFY_SOCKET", "")
        self.addr: str | bytes | None = None
        self.sock: socket.socket | None = None
        if addr.startswith("@"):  # abstract namespace
            self.addr = b"\0" + addr[1:].encode()
        elif addr.startswith("/"):
            self.addr = addr
        if self.addr is not None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.watchdog_usec = 0
        usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_usec = int(usec)

    @property
    def enabled(self) -> bool:
        return self.sock is not None

    def notify(self, state: str) -> bool:
        if self.sock is None or self.addr is None:
            return False
        try:
            self.sock.sendto(state.encode("utf-8"), self.addr)
        except OSError:
            return False  # systemd gone or the socket full: never fatal to the service
        return True

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def activated() -> bool:
    """True when systemd passed this process listening fds (read before listen_fds() unsets them)."""
    return os.environ.get("LISTEN_PID", "") == str(os.getpid()) and os.environ.get("LISTEN_FDS", "0") not in ("", "0")


def listen_fds(unset: bool = True) -> list[int]:
    """sd_listen_fds(3): the fds systemd passed to this process (none when not socket-activated)."""
    pid, n = os.environ.get("LISTEN_PID", ""), os.environ.get("LISTEN_FDS", "")
    fds: list[int] = []
    if pid == str(os.getpid()) and n.isdigit():
        fds = list(range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + int(n)))
        for fd in fds:
            os.set_inheritable(fd, False)
    if unset:  # children must not take these fds for theirs
        for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            os.environ.pop(key, None)
    return fds
