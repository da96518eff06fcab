"""`edgellama install-service`: puts systemd/edgellama.{service,socket}, the serial-line template
edgellama-serial@.service and commented default configs in place (ExecStart pointing at this
edgellama), so `systemctl enable --now edgellama.socket` is the only step left. --root DIR writes
under DIR instead of / (packaging, tests). The udev rule for the serial template is an example to edit.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Any

UNITS = ("edgellama.service", "edgellama.socket", "edgellama-serial@.service")
CONFIG = "edgellama.toml"
TCP_DROP_IN = "edgellama-tcp.conf"  # relaxes PrivateNetwork=/RestrictAddressFamilies= for --http-port
CONFIGS = (CONFIG, "serial.toml")  # edgellama.service's, and edgellama-serial@.service's
UDEV_EXAMPLE = "99-edgellama-serial.rules"


# Where a wheel install puts systemd/ (pyproject.toml's data-files), relative to its prefix
DATA_SUBDIR = Path("share/edgellama/systemd")


def units_dir() -> Path:
    """The systemd/ folder of this source tree, else the copy a wheel installed under the prefix."""
    candidates = [Path(__file__).resolve().parents[2] / "systemd", Path(sysconfig.get_path("data")) / DATA_SUBDIR]
    for here in candidates:
        if all((here / name).is_file() for name in (*UNITS, *CONFIGS)):
            return here
    raise FileNotFoundError("unit files not found in " + " or ".join(str(c) for c in candidates)
                            + " (reinstall edgellama, or run from a source checkout)")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("install-service", help="install the systemd units and a default config",
                       description=__doc__)
    p.add_argument("--root", default="/", help="install under this root (default /)")
    p.add_argument("--exec", dest="exec_cmd", default=None,
                   help="command that runs edgellama (default: this interpreter with -m edgellama.cli)")
    p.add_argument("--force", action="store_true", help="overwrite an existing config file")
    p.add_argument("--tcp", action="store_true",
                   help=f"also install the drop-in {TCP_DROP_IN} that lets the service listen on TCP (http-port)")
    p.set_defaults(handler=install)


def exec_command(explicit: str | None) -> str:
    if explicit:
        return explicit
    found = shutil.which("edgellama")
    return found if found else f"{sys.executable} -m edgellama.cli"


def install(args: argparse.Namespace) -> int:
    src = units_dir()
    root = Path(args.root)
    unit_dst = root / "etc/systemd/system"
    conf_dst = root / "etc/edgellama"
    unit_dst.mkdir(parents=True, exist_ok=True)
    conf_dst.mkdir(parents=True, exist_ok=True)
    cmd = exec_command(args.exec_cmd)
    if cmd.startswith(("/home/", "/root/")):
        print(f"warning: {cmd.split()[0]} is under a home directory, which ProtectHome=yes hides from the service; "
              "install edgellama system-wide or pass --exec", file=sys.stderr)
    for name in UNITS:
        text = (src / name).read_text().replace("/usr/bin/edgellama", cmd)
        (unit_dst / name).write_text(text)
        print(f"installed {unit_dst / name}")
    if args.tcp:
        drop_dir = unit_dst / "edgellama.service.d"
        drop_dir.mkdir(exist_ok=True)
        shutil.copyfile(src / TCP_DROP_IN, drop_dir / TCP_DROP_IN)
        print(f"installed {drop_dir / TCP_DROP_IN} (set http-port and api-key-file in {conf_dst / CONFIG})")
    for name in CONFIGS:
        conf = conf_dst / name
        if conf.exists() and not args.force:
            print(f"kept existing {conf} (--force to replace)")
        else:
            shutil.copyfile(src / name, conf)
            print(f"installed {conf}")
    if (src / UDEV_EXAMPLE).is_file():
        print(f"serial lines: edit and copy {src / UDEV_EXAMPLE} to /etc/udev/rules.d/ (docs/serial.md)")
    if Path(args.root).resolve() == Path("/"):
        print("next: groupadd --system edgellama (clients join it), systemctl daemon-reload, "
              "systemctl enable --now edgellama.socket")
    return 0
