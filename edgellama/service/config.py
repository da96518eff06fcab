"""--config FILE: a TOML table whose keys are the long flag names of `edgellama serve`
(`ctx-size = 2048` or `ctx_size = 2048`); every flag has a key, and a flag given on the command
line wins over the file. Values are checked with the flag's own parser, so errors read the same.
Two tables are not flags: `[models.NAME]` (one model's own flags) and `[aliases]`, read by
service/model_config.py.
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any


class Unset:
    """Marks a flag not given on the command line (so the file may set it)."""

    def __repr__(self) -> str:
        return "<unset>"


UNSET = Unset()
_SKIP = {"help", "config", "handler"}


def mark_defaults(p: argparse.ArgumentParser) -> None:
    """Replaces every flag's default by UNSET, keeping the real defaults for merge()."""
    real: dict[str, Any] = {}
    for a in p._actions:
        if a.dest in _SKIP or a.dest == argparse.SUPPRESS:
            continue
        real[a.dest] = a.default
        # an appending flag adds to its default, which must stay a list (None); merge() reads None as unset
        a.default = None if isinstance(a, argparse._AppendAction) else UNSET
    p.set_defaults(_real_defaults=real, _actions=list(p._actions))


def _key_actions(actions: list[argparse.Action]) -> dict[str, argparse.Action]:
    keys: dict[str, argparse.Action] = {}
    for a in actions:
        if a.dest in _SKIP:
            continue
        for opt in a.option_strings:
            if opt.startswith("--"):
                keys[opt[2:].replace("-", "_")] = a
        keys.setdefault(a.dest, a)
    return keys


def _value(key: str, a: argparse.Action, v: Any, path: Path) -> Any:
    where = f"{path}: {key}"
    if isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(v, bool):
            raise ValueError(f"{where} must be true or false")  # noqa: TRY004 - the CLI reports ValueError
        return v if isinstance(a, argparse._StoreTrueAction) else not v
    if isinstance(a, argparse._AppendAction):  # a repeatable flag: a string or a list of strings
        items = v if isinstance(v, list) else [v]
        if not all(isinstance(x, str) for x in items):
            raise ValueError(f"{where} must be a string or a list of strings")
        return [_converted(where, a, x) for x in items]
    if isinstance(v, (dict, list, bool)):
        kind = "number" if a.type in (int, float) else "string"
        raise ValueError(f"{where} must be a {kind}")  # noqa: TRY004 - the CLI reports ValueError
    return _converted(where, a, v)


def _converted(where: str, a: argparse.Action, v: Any) -> Any:
    conv = a.type if callable(a.type) else str
    try:
        out = conv(str(v))
    except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
        raise ValueError(f"{where}: {exc}") from None
    if a.choices is not None and out not in a.choices:
        raise ValueError(f"{where} must be one of {', '.join(map(str, a.choices))}")
    return out


def merge(args: argparse.Namespace) -> argparse.Namespace:
    """Fills the flags not given on the command line from --config FILE, then from the defaults."""
    file_values: dict[str, Any] = {}
    if getattr(args, "config", None):
        path = Path(args.config)
        try:
            with open(path, "rb") as f:
                table = tomllib.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(f"config file not found: {path}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: not valid TOML: {exc}") from None
        # several models: [models.NAME] tables (a model's own flags) and [aliases] (model_config.py)
        args.model_tables = table.pop("models", {})
        args.alias_tables = table.pop("aliases", {})
        if not isinstance(args.model_tables, dict) or not isinstance(args.alias_tables, dict):
            raise ValueError(f"{path}: models and aliases must be tables ([models.NAME], [aliases])")
        keys = _key_actions(args._actions)
        for key, v in table.items():
            a = keys.get(key.replace("-", "_"))
            if a is None:
                raise ValueError(f"{path}: unknown key {key!r} (keys are the long flags of `edgellama serve`)")
            file_values[a.dest] = _value(key, a, v, path)
    appending = {a.dest for a in args._actions if isinstance(a, argparse._AppendAction)}
    for dest, default in args._real_defaults.items():
        value = getattr(args, dest, UNSET)
        if value is UNSET or (value is None and dest in appending):
            setattr(args, dest, file_values.get(dest, default))
    return args
