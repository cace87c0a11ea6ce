"""Every flag of a long-running command (``maitred serve``, ``maitred sim-worker``) also from the
environment and from a YAML or TOML file, as operators expect of a server.

Precedence, highest first: the command line, then the environment (``MAITRED_<FLAG>`` for
``maitred serve``, e.g. ``MAITRED_PORT``, ``MAITRED_WORKER``; ``MAITRED_SIM_WORKER_<FLAG>`` for
``maitred sim-worker``, so a gateway's ``MAITRED_PORT`` never moves the workers started from the
same shell), then the file (``--config FILE`` or ``$MAITRED_CONFIG``), then the flag's default.
A list flag (``--worker``) set at a higher level replaces the lower level's list.

The settings are derived from the command's argparse definitions rather than declared again
as a pydantic-settings model: each flag then has one definition (name, type, choices, default,
help), a value from a file or a variable goes through the very type function that checks the
flag, and a new flag is configurable without touching this module. What pydantic-settings
would add beyond that (nested models, secrets directories) no flag needs.

A file's keys are the flags' long names without ``--`` (``hold-timeout`` or ``hold_timeout``);
an unknown key is refused by name with the file, a bad value names the key, the file and why;
a key set to null counts as unset.
A variable set to the empty string counts as unset. Standard library only at import (every
``maitred`` call builds the parsers); PyYAML loads when a YAML file is read.
"""

import argparse
import difflib
import json
import os
import shlex
import sys
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ConfigError", "ConfigSpec", "Layers", "layer", "resolve", "run_configured"]

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_SKIPPED = ("help", "version", "config", "print_config", "config_layers")


class ConfigError(ValueError):
    """A refused configuration file, variable or value: one line naming where and what."""


@dataclass(frozen=True, slots=True)
class _Setting:
    value: Any  # as the flag's type parsed it
    source: str  # $VAR or FILE: key
    raw: Any  # as written there


@dataclass
class _Flag:
    action: argparse.Action
    default: Any
    #: the flag's own spelling as a key (its first long name without ``--``) and every spelling
    key: str
    names: tuple[str, ...]
    kind: Any  # the flag's own type function (None: text as is)

    @property
    def is_list(self) -> bool:
        return isinstance(self.action, (argparse._AppendAction, argparse._ExtendAction))

    @property
    def is_switch(self) -> bool:
        return isinstance(self.action, (argparse._StoreTrueAction, argparse._StoreFalseAction))


@dataclass
class Layers:
    """What ``layer`` learnt of a parser, carried on the parsed namespace to ``resolve``."""

    command: str
    env_prefix: str
    flags: dict[str, _Flag]
    secret: frozenset[str]
    #: the text each flag was given on the command line, for ``--print-config``
    given: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ConfigSpec:
    """How one command is configured: its name, its variables' prefix and the flags
    ``--print-config`` hides."""

    command: str
    env_prefix: str
    secret: frozenset[str] = frozenset()

    def layer(self, parser: argparse.ArgumentParser) -> None:
        layer(parser, command=self.command, env_prefix=self.env_prefix, secret=self.secret)


def run_configured(run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """``run(args)`` once ``resolve`` has filled in the settings; with ``--print-config``, print
    them instead. Raises ``ConfigError``."""
    resolve(args)
    if getattr(args, "print_config", False):
        print_config(args)
        return 0
    return run(args)


def layer(parser: argparse.ArgumentParser, *, command: str, env_prefix: str, secret: frozenset[str] = frozenset()) -> None:
    """Add ``--config FILE`` and ``--print-config`` to ``parser``, and make every other flag's
    default None so ``resolve`` can tell what the command line set (no flag value parses to
    None). ``secret`` names the flags ``--print-config`` shows as ``***``."""
    flags: dict[str, _Flag] = {}
    layers = Layers(command, env_prefix, flags, secret)
    for action in parser._actions:
        longs = tuple(o[2:] for o in action.option_strings if o.startswith("--"))
        if action.dest in _SKIPPED or not longs or action.dest == argparse.SUPPRESS:
            continue
        if action.dest in flags:  # another spelling of a flag already seen (--worker-urls)
            flags[action.dest].names += longs
        else:
            flags[action.dest] = _Flag(action, action.default, longs[0], longs, action.type)
        action.type = _recording(action, layers)
        action.default = None
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"read settings from this YAML or TOML file, keys named as the flags without -- (default: ${env_prefix}CONFIG); "
        f"the command line wins over ${env_prefix}<FLAG> variables, which win over the file",
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the effective settings and where each came from, then exit"
    )
    parser.set_defaults(config_layers=layers)


def _recording(action: argparse.Action, layers: Layers) -> Any:
    """The action's type, also keeping the text it was given (argparse names the type in errors)."""
    kind = action.type
    if action.nargs == 0:
        return kind

    def parse(text: str) -> Any:
        layers.given.setdefault(action.dest, []).append(text)
        return kind(text) if callable(kind) else text

    parse.__name__ = getattr(kind, "__name__", "str")
    return parse


def _convert(flag: _Flag, value: Any, where: str) -> Any:
    """``value`` (text from a variable, or what a file holds) through the flag's own checks."""
    action = flag.action
    if flag.is_switch:
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            value = value.strip().lower() in _TRUE
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: must be true or false, got {value!r}")
        return value if isinstance(action, argparse._StoreTrueAction) else not value
    if flag.is_list:
        return [_one(flag, item, where) for item in _as_list(value)]
    return _one(flag, value, where)


def _one(flag: _Flag, value: Any, where: str) -> Any:
    if isinstance(value, (dict, list, bool)) or value is None:
        raise ConfigError(f"{where}: takes one value (a string or a number), got {json.dumps(value)}")
    text, kind, choices = str(value), flag.kind, flag.action.choices
    try:
        converted = kind(text) if callable(kind) else text
    except argparse.ArgumentTypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: invalid {getattr(kind, '__name__', 'value')} value: {text!r}") from None
    if choices is not None and converted not in choices:
        raise ConfigError(f"{where}: invalid choice {text!r} (choose from {', '.join(map(str, choices))})")
    return converted


def read_file(path: str) -> dict[str, Any]:
    """The mapping a YAML (``.yaml``, ``.yml``) or TOML (``.toml``) file holds."""
    suffix = Path(path).suffix.lower()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot read ({exc.strerror or exc})") from None
    if suffix == ".toml":
        try:
            data: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    elif suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"{path}: not valid YAML{at} ({getattr(exc, 'problem', None) or exc})") from None
    else:
        raise ConfigError(f"--config {path}: name a .yaml, .yml or .toml file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must hold a mapping of settings (key: value), got a {type(data).__name__}")
    return data


def _file_values(layers: Layers, path: str) -> dict[str, _Setting]:
    by_name = {name.replace("-", "_"): flag for flag in layers.flags.values() for name in flag.names}
    out: dict[str, _Setting] = {}
    for key, raw in read_file(path).items():
        flag = by_name.get(str(key).replace("-", "_"))
        if flag is not None and raw is None:  # ``key:`` or ``key: null``: as if absent
            continue
        if flag is None:
            near = difflib.get_close_matches(str(key).replace("_", "-"), [n for f in layers.flags.values() for n in f.names], 1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ConfigError(f"{path}: unknown key {key!r}: maitred {layers.command} has no --{key}{hint}")
        setting = _Setting(_convert(flag, raw, f"{path}: {key}"), f"{path}: {key}", raw)
        out[flag.action.dest] = _merged(flag, out.get(flag.action.dest), setting)
    return out


def _merged(flag: _Flag, earlier: _Setting | None, later: _Setting) -> _Setting:
    """Two spellings of one flag in one source (``worker`` and ``worker-urls``): lists add up."""
    if earlier is None:
        return later
    if not flag.is_list:
        raise ConfigError(f"{later.source}: set twice (also as {earlier.source})")
    raw = [*_as_list(earlier.raw), *_as_list(later.raw)]
    return _Setting(earlier.value + later.value, f"{earlier.source}, {later.source}", raw)


def _as_list(raw: Any) -> list[Any]:
    return shlex.split(raw) if isinstance(raw, str) else raw if isinstance(raw, list) else [raw]


def _env_values(layers: Layers, environ: Mapping[str, str]) -> dict[str, _Setting]:
    out: dict[str, _Setting] = {}
    for dest, flag in layers.flags.items():
        for name in flag.names:
            var = layers.env_prefix + name.upper().replace("-", "_")
            if environ.get(var):
                raw = _as_list(environ[var]) if flag.is_list else environ[var]
                setting = _Setting(_convert(flag, environ[var], f"${var}"), f"${var}", raw)
                out[dest] = _merged(flag, out.get(dest), setting)
    return out


def resolve(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> argparse.Namespace:
    """Fill in what the command line left unset from the environment, then the file, then the
    defaults; ``args.config_sources`` says where each value came from (``--flag``, ``$VAR``,
    ``FILE: key`` or ``default``). A namespace from a parser ``layer`` never saw is returned as is.
    Raises ``ConfigError``."""
    layers: Layers | None = getattr(args, "config_layers", None)
    if layers is None:
        return args
    environ = os.environ if environ is None else environ
    path = args.config or environ.get(layers.env_prefix + "CONFIG") or None
    from_file = _file_values(layers, path) if path else {}
    from_env = _env_values(layers, environ)
    sources: dict[str, str] = {}
    shown: dict[str, Any] = {}
    for dest, flag in layers.flags.items():
        setting = from_env.get(dest) or from_file.get(dest)
        if getattr(args, dest) is not None:
            sources[dest] = f"--{flag.key}"
            texts = layers.given.get(dest, [])
            shown[dest] = getattr(args, dest) if flag.is_switch else texts if flag.is_list else texts[-1]
        elif setting is not None:
            setattr(args, dest, setting.value)
            sources[dest], shown[dest] = setting.source, setting.raw
        else:
            setattr(args, dest, _default(flag))
            sources[dest], shown[dest] = "default", flag.default
    args.config_sources = sources
    args.config_shown = shown
    return args


def _default(flag: _Flag) -> Any:
    """The flag's default as argparse gives it: a string default goes through the type."""
    default = flag.default
    if isinstance(default, list):
        return list(default)
    if isinstance(default, str) and callable(flag.kind):
        return _one(flag, default, f"default of --{flag.key}")
    return default


def print_config(args: argparse.Namespace) -> None:
    """The effective settings as YAML (a valid ``--config`` file), each value as it was written
    (``--max-body-mb 8`` shows 8, not the bytes it parses to) and where it came from."""
    layers: Layers = args.config_layers
    sys.stdout.write(
        f"# maitred {layers.command}: effective settings (command line > ${layers.env_prefix}<FLAG> > --config file > default)\n"
    )
    for dest, flag in layers.flags.items():
        value = args.config_shown[dest]
        if dest in layers.secret and value is not None:
            value = "***"
        text = json.dumps(list(value) if isinstance(value, tuple) else value, default=str)
        sys.stdout.write(f"{flag.key}: {text}  # {args.config_sources[dest]}\n")
