"""Every flor setting, from command-line flags and ``FLOR_*`` variables. The only reader of both.

Flags (removed from ``sys.argv`` at import, wherever they stand, so the script's own
argparse never sees them) and their environment equivalents:

=============================  ===================  =============================================
flag                           variable             meaning
=============================  ===================  =============================================
``--flor NAME``                ``FLOR_NAME``        record into (or replay from) experiment NAME
``--replay_flor [PID/NGPUS]``  ``FLOR_REPLAY``      replay; optionally the PID-th of NGPUS segments
``--flor_run RUN``             ``FLOR_RUN``         replay this recorded run instead of the latest
``--flor_strict``              ``FLOR_STRICT=1``    a replay that diverges exits with status 3
``--flor_strong``              ``FLOR_STRONG=1``    initialize a replay worker from epoch 0
``--flor_every N``             ``FLOR_EVERY``       record: checkpoint every N-th epoch only
(none)                         ``FLOR_HOME``        root of the store (default ``~/.flor``)
(none)                         ``FLOR_REPLAY_ID``   shared id of the workers of one replay
=============================  ===================  =============================================

Flags win over variables. ``--replay_flor 3/5`` takes the next word as its value when it has
the form ``X/Y`` and is not an existing path; ``--replay_flor=3/5`` is never ambiguous.
Without PID/NGPUS a replay worker is placed by torchrun (``RANK``/``WORLD_SIZE``) or Slurm
(``SLURM_ARRAY_TASK_ID``/``SLURM_ARRAY_TASK_COUNT``, else ``SLURM_PROCID``/``SLURM_NTASKS``).

This module imports no torch.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from .errors import ConfigError

__all__ = ["Settings", "parse", "validate_name", "SETTINGS"]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
_SEGMENT_RE = re.compile(r"^-?[A-Za-z0-9]*/[A-Za-z0-9]*$")
_BOOL_TRUE = {"1", "true", "yes", "on"}
_BOOL_FALSE = {"0", "false", "no", "off", ""}

#: flags that take a value, and flags that are switches
_VALUE_FLAGS = {"--flor", "--flor_run", "--flor_every"}
_SWITCH_FLAGS = {"--flor_strict", "--flor_strong"}


@dataclass(frozen=True)
class Settings:
    """What flor was asked to do in this process."""

    mode: str = "inert"  # "inert" | "record" | "replay"
    name: str | None = None
    home: Path = field(default_factory=lambda: Path("~/.flor").expanduser())
    pid: int = 0
    ngpus: int = 1
    placed_by: str = "default"  # where pid/ngpus came from
    run: str | None = None
    strict: bool = False
    strong: bool = False
    every: int = 1
    replay_id: str | None = None

    @property
    def experiment_dir(self) -> Path:
        assert self.name is not None  # only called once a run has a name
        return self.home / self.name


def validate_name(name: str) -> str:
    """Return ``name`` if it is a safe experiment name, else raise ConfigError.

    Names are one path component of letters, digits, ``.``, ``_``, ``+`` and ``-``, starting
    with a letter or digit, so a name can never escape the store root.

    >>> validate_name("cnn-demo")
    'cnn-demo'
    """
    if not isinstance(name, str) or not _NAME_RE.match(name) or ".." in name:
        raise ConfigError(
            f"invalid experiment name {name!r}: use 1-128 letters, digits, '.', '_', '+' or '-', "
            "starting with a letter or digit and without '..' (for example --flor cnn-demo)"
        )
    return name


def _parse_segment(text: str, origin: str) -> tuple[int, int]:
    m = re.match(r"^(\d+)/(\d+)$", text.strip())
    if not m:
        raise ConfigError(
            f"{origin}: {text!r} is not PID/NGPUS; write two whole numbers like 0/4 "
            "(0-based PID, 0 <= PID < NGPUS), or leave the value out to replay every epoch"
        )
    pid, ngpus = int(m.group(1)), int(m.group(2))
    if ngpus < 1:
        raise ConfigError(f"{origin}: NGPUS must be at least 1 in {text!r}; for example 0/1")
    if pid >= ngpus:
        raise ConfigError(
            f"{origin}: PID {pid} is out of range in {text!r}: PIDs are 0-based, so with "
            f"{ngpus} workers use 0..{ngpus - 1}"
        )
    return pid, ngpus


def _parse_bool(text: str, origin: str) -> bool:
    low = text.strip().lower()
    if low in _BOOL_TRUE:
        return True
    if low in _BOOL_FALSE:
        return False
    raise ConfigError(f"{origin}={text!r} is not a yes/no value; use 1 or 0")


def _parse_every(text: str, origin: str) -> int:
    try:
        every = int(text)
    except ValueError:
        every = 0
    if every < 1:
        raise ConfigError(f"{origin}: {text!r} is not a positive whole number of epochs; e.g. 5")
    return every


def _int_env(env: Mapping[str, str], key: str) -> int | None:
    value = env.get(key)
    if value is None or value.strip() == "":
        return None
    try:
        return int(value)
    except ValueError as exc:
        raise ConfigError(f"{key}={value!r} is not a whole number; unset it or fix it") from exc


def _placement(env: Mapping[str, str]) -> tuple[int, int, str]:
    """Worker place from torchrun or Slurm variables, else a single worker."""
    candidates = [
        ("RANK", "WORLD_SIZE", "torchrun", 0),
        ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "slurm array", _int_env(env, "SLURM_ARRAY_TASK_MIN") or 0),
        ("SLURM_PROCID", "SLURM_NTASKS", "slurm", 0),
    ]
    for pid_key, n_key, origin, offset in candidates:
        pid, n = _int_env(env, pid_key), _int_env(env, n_key)
        if pid is None or n is None:
            continue
        pid -= offset
        text = f"{pid}/{n}"
        return (*_parse_segment(text, f"{pid_key}/{n_key}"), origin)
    return 0, 1, "default"


def _split_flags(argv: Sequence[str]) -> tuple[dict[str, str | None], list[str]]:
    """Take flor's flags out of argv; return them and the script's own argv."""
    found: dict[str, str | None] = {}
    rest: list[str] = [argv[0]] if argv else []
    i = 1
    while i < len(argv):
        word = argv[i]
        if word == "--":  # the script's own separator: everything after it is the script's
            rest.extend(argv[i:])
            break
        flag, eq, inline = word.partition("=")
        if not (flag == "--flor" or flag.startswith("--flor_") or flag == "--replay_flor"):
            rest.append(word)
            i += 1
            continue
        if flag in found:
            raise ConfigError(f"flag {flag} is given twice; give it once")
        if flag in _VALUE_FLAGS:
            if eq:
                found[flag] = inline
            elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                found[flag] = argv[i + 1]
                i += 1
            else:
                raise ConfigError(f"flag {flag} needs a value, e.g. {flag}=VALUE")
        elif flag in _SWITCH_FLAGS:
            found[flag] = inline if eq else "1"
        elif flag == "--replay_flor":
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if eq:
                found[flag] = inline
            elif nxt is not None and _SEGMENT_RE.match(nxt) and not os.path.exists(nxt):
                found[flag] = nxt
                i += 1
            else:
                found[flag] = None
        else:
            known = sorted(_VALUE_FLAGS | _SWITCH_FLAGS | {"--replay_flor"})
            raise ConfigError(f"unknown flor flag {word!r}; the flags are {', '.join(known)}")
        i += 1
    return found, rest


def parse(argv: Sequence[str], env: Mapping[str, str]) -> tuple[Settings, list[str]]:
    """Read flor's settings from ``argv`` and ``env``; return them and the script's argv.

    >>> s, rest = parse(["train.py", "--lr", "0.1", "--flor", "x", "--replay_flor", "1/2"], {})
    >>> (s.mode, s.name, s.pid, s.ngpus, rest)
    ('replay', 'x', 1, 2, ['train.py', '--lr', '0.1'])
    """
    flags, rest = _split_flags(argv)

    name = flags.get("--flor", env.get("FLOR_NAME") or None)
    if "--replay_flor" in flags:
        replay, replay_value, replay_origin = True, flags["--replay_flor"], "--replay_flor"
    else:
        raw = env.get("FLOR_REPLAY", "")
        low = raw.strip().lower()
        replay_origin = "FLOR_REPLAY"
        if low in _BOOL_FALSE:
            replay, replay_value = False, None
        elif low in _BOOL_TRUE or low == "all":
            replay, replay_value = True, None
        else:
            replay, replay_value = True, raw

    home_text = env.get("FLOR_HOME") or "~/.flor"
    home = Path(home_text).expanduser()
    if not home.is_absolute():
        home = Path.cwd() / home

    strict = _parse_bool(flags.get("--flor_strict") or env.get("FLOR_STRICT", "0"), "--flor_strict/FLOR_STRICT")
    strong = _parse_bool(flags.get("--flor_strong") or env.get("FLOR_STRONG", "0"), "--flor_strong/FLOR_STRONG")
    every_text = flags.get("--flor_every") or env.get("FLOR_EVERY")
    every = _parse_every(every_text, "--flor_every/FLOR_EVERY") if every_text is not None else 1
    run = flags.get("--flor_run") or env.get("FLOR_RUN") or None

    if name is None:
        if replay:
            raise ConfigError(
                f"{replay_origin} needs an experiment to replay: add --flor NAME (or set FLOR_NAME)"
            )
        return Settings(mode="inert", home=home), rest
    validate_name(name)

    if not replay:
        return Settings(mode="record", name=name, home=home, every=every, strict=strict), rest

    if replay_value is not None and replay_value.strip().lower() not in ("", "all"):
        pid, ngpus = _parse_segment(replay_value, replay_origin)
        placed_by = replay_origin
    else:
        pid, ngpus, placed_by = _placement(env)
    if run is not None and not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", run):
        raise ConfigError(f"invalid run id {run!r}; `flor ls {name}` lists the runs")
    replay_id = env.get("FLOR_REPLAY_ID") or None
    if replay_id is not None and not re.match(r"^[A-Za-z0-9._-]{1,64}$", replay_id):
        raise ConfigError(f"FLOR_REPLAY_ID={replay_id!r} must be letters, digits, '.', '_' or '-'")
    return (
        Settings(
            mode="replay", name=name, home=home, pid=pid, ngpus=ngpus, placed_by=placed_by,
            run=run, strict=strict, strong=strong, replay_id=replay_id,
        ),
        rest,
    )


def _from_process() -> Settings:
    """Parse this process's flags once, at import, and take them out of ``sys.argv``.

    Bad flags end the process with status 2 and one clear line before the script runs,
    so nothing is recorded or overwritten.
    """
    argv0 = os.path.basename(sys.argv[0]) if sys.argv else ""
    if argv0 in ("flor", "flor.exe") or argv0 == "__main__.py" and "flor" in sys.argv[0]:
        return Settings()  # the flor command itself: its arguments are its own
    try:
        settings, rest = parse(sys.argv, os.environ)
    except ConfigError as exc:
        print(f"flor: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    sys.argv[:] = rest
    return settings


SETTINGS: Settings = _from_process()
