"""Hyperparameters: the script's argparse namespace, captured with no extra code, and ``flor.arg``.

When flor records or replays (never when it is inert), importing flor wraps
``argparse.ArgumentParser.parse_known_args`` (which ``parse_args`` calls) so that the
namespace of every top-level parse of the command line is kept. The recording writes it to
``run.json`` under ``hyperparameters``, together with the values of ``flor.arg``; ``flor
show``, ``flor logs`` and ``flor compare --by`` read it from there. Calls that parse an
explicit list (``parser.parse_args(["--x", "1"])``) are not the command line and are not
captured. Values whose flag names look secret (key, token, password...) are stored as
``***``, and secret-shaped strings (``sk-...``, ``ghp_...``, a URL's password) are hidden
(``flor.redact.redact_value``); a replay uses today's value where the recorded one was hidden.
"""

from __future__ import annotations

import argparse
import functools
import sys
import threading
from pathlib import Path
from typing import Any, Callable, TypeVar

from .errors import ConfigError
from .redact import REDACTED, is_secret_name, redact_value

__all__ = ["arg", "captured", "install_argparse_capture", "jsonable", "secret_flags", "subscribe"]

T = TypeVar("T")

_CAPTURED: dict[str, Any] = {}
_LISTENERS: list[Callable[[dict[str, Any]], None]] = []
_ARGS: dict[str, Any] = {}  # flor.arg values handed out in this process
_SECRET_FLAGS: set[str] = set()  # option strings whose dest is secret-like (--hf of dest="hf_token")
_LOCAL = threading.local()


def jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it: scalars as they are, sequences as lists, the rest as text."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, Path):
        return str(value)
    name = getattr(value, "name", None)  # argparse.FileType gives open files: keep the name
    if hasattr(value, "read") and isinstance(name, str):
        return name
    return str(value)


def _redacted(values: dict[str, Any]) -> dict[str, Any]:
    """Secret names' values as ``***``, secret-shaped strings hidden (``flor.redact.redact_value``)."""
    return {k: redact_value(k, jsonable(v)) for k, v in values.items()}


def captured() -> dict[str, Any]:
    """The hyperparameters captured so far in this process (argparse and ``flor.arg``)."""
    return dict(_CAPTURED)


def secret_flags() -> frozenset[str]:
    """The option strings of the argparse options parsed so far whose dest is secret-like: their
    values are hidden in the recorded argv too (``flor.redact.redact_argv``)."""
    return frozenset(_SECRET_FLAGS)


def subscribe(listener: Callable[[dict[str, Any]], None]) -> None:
    """Call ``listener(captured())`` whenever more hyperparameters are captured."""
    _LISTENERS.append(listener)


def _capture(values: dict[str, Any]) -> None:
    _CAPTURED.update(_redacted(values))
    for listener in list(_LISTENERS):
        listener(captured())


def install_argparse_capture() -> None:
    """Wrap ``ArgumentParser.parse_known_args`` once; called at import when flor is not inert."""
    original = argparse.ArgumentParser.parse_known_args
    if getattr(original, "_flor_capture", False):
        return

    @functools.wraps(original)
    def parse_known_args(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        depth = getattr(_LOCAL, "depth", 0)
        _LOCAL.depth = depth + 1  # subparsers parse again inside: only the outer call counts
        try:
            result = original(self, args, namespace)
        finally:
            _LOCAL.depth = depth
        if depth == 0 and args is None:
            _SECRET_FLAGS.update(o for a in self._actions if isinstance(a.dest, str) and is_secret_name(a.dest)
                                 for o in a.option_strings)
            try:
                values = dict(vars(result[0]))
            except TypeError:  # a namespace object without __dict__
                values = {}
            _capture(values)
        return result

    parse_known_args._flor_capture = True  # type: ignore[attr-defined]
    argparse.ArgumentParser.parse_known_args = parse_known_args  # type: ignore[method-assign]


# -- flor.arg ----------------------------------------------------------------------------

def _from_command_line(name: str, argv: list[str]) -> tuple[bool, str | None]:
    """Whether ``--name`` is on the command line, and its value (None for a bare switch)."""
    flags = {f"--{name}", f"--{name.replace('_', '-')}"}
    for i, word in enumerate(argv):
        flag, eq, value = word.partition("=")
        if flag in flags:
            if eq:
                return True, value
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if nxt is not None and not (nxt.startswith("--") or nxt.startswith("-") and not _is_number(nxt)):
                return True, nxt
            return True, None
    return False, None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _convert(name: str, text: str | None, default: Any) -> Any:
    kind = type(default)
    if isinstance(default, bool):
        if text is None:
            return True
        low = text.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"--{name}={text!r} is not a yes/no value (flor.arg({name!r}, {default!r})); "
                          "use true or false")
    if text is None:
        raise ConfigError(f"--{name} needs a value, e.g. --{name}={default!r} (flor.arg({name!r}, {default!r}))")
    if default is None or isinstance(default, str):
        return text
    try:
        return kind(text)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"--{name}={text!r} is not a valid {kind.__name__}, the type of the default in "
            f"flor.arg({name!r}, {default!r}); "
            "fix the value on the command line"
        ) from exc


def parse(name: str, default: Any) -> tuple[bool, Any]:
    """Whether ``--name`` is on the command line, and the value it asks for (``default`` if
    not): a ConfigError for a bad name or value, which ``flor.arg`` raises before any session
    starts (a recording that cannot start leaves no empty run behind)."""
    if not isinstance(name, str) or not name or name.startswith("-"):
        raise ConfigError(f"flor.arg needs a name like 'lr', not {name!r}")
    given, text = _from_command_line(name, list(sys.argv[1:]))
    return given, (_convert(name, text, default) if given else default)


def arg(name: str, default: T, session: Any = None, *, recording: bool = False) -> T:
    """Declare a hyperparameter: its value for this run, recorded with the run.

    Recording (and plain runs): ``--NAME VALUE`` (or ``--NAME=VALUE``) on the command line
    if given, converted to the type of ``default``, else ``default``; the recording keeps it
    in ``run.json``. Replaying: the recorded value, whatever the command line says (with a
    note when it asks for another), so a replay cannot silently run with other settings.

    Scripts that parse their flags with argparse need no ``flor.arg``: the namespace is
    recorded anyway. Use it for settings that are not flags.

    >>> lr = arg("lr", 0.01)
    >>> lr
    0.01
    """
    if name in _ARGS:
        return _ARGS[name]
    given, wanted = parse(name, default)
    value = wanted
    if session is not None and session.mode == "replay":
        recorded = (session.meta.hyperparameters)
        if name in recorded and recorded[name] != REDACTED:  # a secret was not kept: use today's
            value = recorded[name]
            if isinstance(default, tuple) and isinstance(value, list):
                value = tuple(value)
            if given and jsonable(wanted) != recorded[name]:
                session.note("FL333", f"flor.arg({name!r}): the command line asks for "
                             f"{redact_value(name, wanted)!r}, the "
                             f"recording used {value!r}; replaying with the recorded value (record again to change it)")
        elif name not in recorded:
            session.note("FL334", f"flor.arg({name!r}) is not in the recording; using {redact_value(name, wanted)!r}")
    _ARGS[name] = value
    if recording:  # the recording reads captured() when it starts, and follows later captures
        _capture({name: value})
    return value
