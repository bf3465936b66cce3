"""`diloco-node --config FILE`: the node's flags in a TOML file; flags on the command line override it.

Each key is a flag's name without the leading dashes (`run-id`, `key`, `peers`, `inner-steps`, ...;
underscores work too); values are TOML strings, numbers or booleans (`closed = true`). A list gives a
comma-separated flag (`peers = ["10.0.0.1:7000", "10.0.0.2:7000"]`, `data`); `set` is a table of config
overrides (`[set]` then `lr = 0.001`). An unknown key, or a value of the wrong kind, is an error naming the
key. Example:

    run-id = "my-run"
    key = "node.key"
    listen = "0.0.0.0:7000"
    http = "0.0.0.0:8000"
    peers = ["10.0.0.1:7000"]
    model = "small"
    checkpoint-dir = "ckpt"
    log-format = "json"
    [set]
    total_steps = 20000
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

__all__ = ["apply_config_file"]


class ConfigFileError(ValueError):
    pass


def _value(action: argparse.Action, key: str, value: object) -> object:
    """`value` as argparse would hold it after reading the flag (strings are converted by argparse)."""
    if isinstance(action, argparse._StoreTrueAction | argparse.BooleanOptionalAction):
        if not isinstance(value, bool):
            raise ConfigFileError(f"{key} takes true or false, not {value!r}")
        return value
    if isinstance(action, argparse._AppendAction):  # --set
        if not isinstance(value, dict):
            raise ConfigFileError(f"{key} is a table of name = value")
        return [f"{name}={'true' if v is True else 'false' if v is False else v}" for name, v in value.items()]
    if isinstance(value, list):
        if not all(isinstance(v, str | int | float) for v in value):
            raise ConfigFileError(f"{key}: a list of strings or numbers")
        return action.type(",".join(str(v) for v in value)) if action.type else ",".join(map(str, value))
    if isinstance(value, dict | bool):
        raise ConfigFileError(f"{key} takes a string or a number, not {value!r}")
    text = str(value)
    if action.choices is not None and text not in action.choices:
        raise ConfigFileError(f"{key} must be one of {', '.join(map(str, action.choices))}, not {text!r}")
    return action.type(text) if action.type else text


def apply_config_file(parser: argparse.ArgumentParser, path: Path) -> frozenset[str]:
    """Make `path`'s settings the parser's defaults; returns their destinations. Raises ConfigFileError
    (one line, naming the file and the key) for a file that cannot be read or holds a bad setting."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigFileError(f"--config {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"--config {path}: not TOML: {exc}") from None
    actions = {a.dest: a for a in parser._actions if a.dest not in ("help", "config")}
    defaults: dict[str, object] = {}
    for key, value in data.items():
        dest = "overrides" if key == "set" else key.replace("-", "_")
        action = actions.get(dest)
        if action is None:
            raise ConfigFileError(f"--config {path}: unknown setting {key!r} (keys are the flags without dashes)")
        try:
            defaults[dest] = _value(action, key, value)
        except ConfigFileError as exc:
            raise ConfigFileError(f"--config {path}: {exc}") from None
        except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
            raise ConfigFileError(f"--config {path}: {key} = {value!r} cannot be read ({exc})") from None
        action.required = False  # given by the file
    parser.set_defaults(**defaults)
    return frozenset(defaults)
