"""A null-modem cable made of two real ptys, for the serial tests and bench/serial.py: the server opens
one pty's slave (the "device"), the client opens the other's with pyserial, and two threads copy bytes
between the masters with blocking writes, so flow control on one end backs up to the other."""

from __future__ import annotations

import os
import select
import threading
import time
import tty
from typing import Any

import serial


class PtyPair:
    """os.openpty(), raw from the start; the slave fd stays open here so the master never reads EIO
    while the far end (the server) closes and reopens the device."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        tty.setraw(self.slave)
        self.path = os.ttyname(self.slave)

    def close(self) -> None:
        for fd in (self.master, self.slave):
            try:
                os.close(fd)
            except OSError:
                pass


class NullModem:
    """device (the server's end) <-> client (pyserial's end). replace_device() swaps in a new device pty
    behind the same client, as an adapter unplugged and plugged back."""

    def __init__(self) -> None:
        self.device = PtyPair()
        self.client = PtyPair()
        self.stopped = False
        self._start(self._copy, self.client, "to_device")
        self._start(self._copy, self.device, "to_client")

    def _start(self, fn: Any, *args: Any) -> None:
        threading.Thread(target=fn, args=args, daemon=True).start()

    def _copy(self, src: PtyPair, direction: str) -> None:
        while not self.stopped:
            if direction == "to_client" and src is not self.device:
                return  # this device was replaced
            try:
                r, _, _ = select.select([src.master], [], [], 0.1)
                if not r:
                    continue
                data = os.read(src.master, 4096)
            except OSError:
                return
            dst = self.client if direction == "to_client" else self.device
            try:
                os.write(dst.master, data)  # blocking: a stalled reader stalls this copy, as a wire would
            except OSError:
                if direction == "to_client":
                    return

    def replace_device(self) -> PtyPair:
        old, self.device = self.device, PtyPair()
        self._start(self._copy, self.device, "to_client")
        return old

    def open_client(self, timeout: float = 120.0, **kw: Any) -> serial.Serial:
        return serial.Serial(self.client.path, 115200, timeout=timeout, **kw)

    def close(self) -> None:
        self.stopped = True
        time.sleep(0.15)
        self.device.close()
        self.client.close()
