"""One --serial port's settings (PortConfig): what the port (serial_port.py) and its text mode
(serial_text.py) both read, kept apart from either so neither imports the other for it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class PortConfig:
    """One --serial port; every field but url has a serve flag giving its default for all ports."""

    url: str
    baud: int = 115200
    bytesize: int = 8
    parity: str = "N"
    stopbits: str = "1"
    rtscts: bool = False
    xonxoff: bool = False
    mode: str = "auto"
    chat: bool = False
    eol: str = "crlf"
    encoding: str = "utf-8"
    end_marker: str = "."
    line_timeout: float = 10.0
    buffer: int = 16384
    max_line: int = 65536

    @property
    def name(self) -> str:
        """The metrics label and log name: the path under /dev (ttyUSB0, pts/3), a file name, or the URL."""
        if self.url.startswith("/dev/"):
            return self.url[len("/dev/"):]
        return os.path.basename(self.url) if self.url.startswith("/") else self.url
