"""Every flor setting, from command-line flags and ``FLOR_*`` variables. The only reader of both.

Flags (removed from ``sys.argv`` at import, wherever they stand, so the script's own
argparse never sees them) and their environment equivalents:

=============================  ===================  =============================================
flag                           variable             meaning
=============================  ===================  =============================================
``--flor NAME``                ``FLOR_NAME``        record into (or replay from) experiment NAME
``--replay_flor [PID/NGPUS]``  ``FLOR_REPLAY``      replay; optionally the PID-th of NGPUS segments
``--flor_run RUN``             ``FLOR_RUN``         replay this recorded run instead of the latest
``--flor_verdict V``           ``FLOR_VERDICT``     replay: how a worker ends, on one axis: ``strict`` (also fail
                                                    when state cannot be restored), ``default`` (a divergence
                                                    exits 3) or ``lenient`` (exit 0 even when values diverged)
``--flor_strict``              ``FLOR_STRICT=1``    the same as ``--flor_verdict strict``
``--flor_lenient``             ``FLOR_LENIENT=1``   the same as ``--flor_verdict lenient``
``--flor_strong``              ``FLOR_STRONG=1``    initialize a replay worker from epoch 0
``--flor_every N``             ``FLOR_EVERY``       record: checkpoint every N-th epoch (no adaptation)
``--flor_overhead F``          ``FLOR_OVERHEAD``    record: checkpoint budget, a fraction of training
                                                    time (default 0.01 = 1%); past it, checkpoints that
                                                    save a replay 20x their cost, up to 5x it
``--flor_spool URL``           ``FLOR_SPOOL``       spool to (record) or fetch from (replay) ``s3://bucket/prefix``
``--flor_epochs A:B``          ``FLOR_EPOCHS``      replay only epochs A..B-1 (a slice: ``40:61``, ``40:``,
                                                    ``:10``, ``7``)
``--flor_threads N``           ``FLOR_THREADS``     replay with N torch threads, not the recorded count (not bit-exact)
``--flor_export T``            ``FLOR_EXPORT``      replay: at its end (a single worker's; ``flor replay --export``
                                                    for several), export the run's values to tracker(s) T:
                                                    ``mlflow``, ``wandb``, ``tensorboard`` (``flor export``)
``--flor_trust_pickles``       ``FLOR_TRUST_PICKLES=1`` replay: load pickled leaves of any manifest, signed or not
                                                    (a pickle can run code: only for stores you trust)
(none)                         ``FLOR_CONFIG_DIR``  flor's config folder, holding ``key`` (default
                                                    ``$XDG_CONFIG_HOME/flor``, else ``~/.config/flor``)
(none)                         ``FLOR_HOME``        root of the store (default ``~/.flor``)
(none)                         ``FLOR_SPOOL_WAIT``  seconds a recording waits at exit for its uploads (300)
(none)                         ``FLOR_SPOOL_BUDGET`` evict spooled local blobs past this size, e.g. 20GB
(none)                         ``FLOR_FLUSH_TIMEOUT`` record: seconds the exit (and SIGTERM/SIGHUP/SIGINT) waits
                                                    for queued checkpoints before abandoning them (20)
(none)                         ``FLOR_WRITER_MEMORY`` record: bytes of snapshots queued for the background
                                                    writer, e.g. 512MB (min(1 GiB, 10% of RAM)); past it an
                                                    epoch's checkpoint is skipped, never waited for
(none)                         ``FLOR_MALLOC``      ``default``: leave glibc's malloc thresholds alone;
                                                    ``raise`` (the default): raise them once (``flor.malloc``)
(none)                         ``FLOR_REPLAY_ID``   shared id of the workers of one replay
(none)                         ``FLOR_RANK_TIMEOUT`` seconds the ranks of a DDP run (and torchrun's replay workers)
                                                    wait for rank 0 to name the run or replay (600)
(none)                         ``FLOR_DEBUG=1``     a FlorError ends the script with its traceback too
                                                    (else one line ``flor: error: ...``, exit status 2)
=============================  ===================  =============================================

Workers placed by Slurm share a replay id derived from the job (``slurm<JOBID>`` for an
array, ``slurm<JOBID>.<STEPID>`` for ``srun``), and torchrun's workers one derived from
``TORCHELASTIC_RUN_ID`` (or agreed through torchrun's store, see ``flor.ddp``), so the logs
of one replay group together without ``FLOR_REPLAY_ID``.

``--flor_verdict`` and its two aliases are one setting: flags that set it two ways
(``--flor_strict --flor_lenient``, ``--flor_verdict lenient --flor_strict``) are an error, as are
variables that do (``FLOR_STRICT=1 FLOR_LENIENT=1``); any of the flags wins over all of the variables.

Every value is checked in every mode; a flag on the command line that the mode does not use
(a replay-only flag while recording, ``--flor_every``/``--flor_overhead`` while replaying) gets a
one-line note. Flags win over variables. ``--replay_flor 3/5`` takes the next word as its value when it has
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
from typing import Any, Mapping, Sequence

from .errors import ConfigError
from .placement import parse_segment, shared_replay_id, worker_place

__all__ = ["EXPORT_TARGETS", "Settings", "VERDICTS", "VERDICT_VARIABLES", "parse", "parse_epoch_range", "parse_export",
           "parse_s3_url", "strip_flor_flags", "validate_name", "SETTINGS"]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
_SEGMENT_RE = re.compile(r"^-?[A-Za-z0-9]*/[A-Za-z0-9]*$")
_BOOL_TRUE = {"1", "true", "yes", "on"}
_BOOL_FALSE = {"0", "false", "no", "off", ""}

#: flags that take a value, and flags that are switches
_VALUE_FLAGS = {"--flor", "--flor_epochs", "--flor_threads", "--flor_run", "--flor_every", "--flor_overhead",
                "--flor_spool", "--flor_verdict", "--flor_export"}
#: S3's bucket naming rules (lowercase letters, digits, '.', '-'; 3 to 63 characters)
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_SWITCH_FLAGS = {"--flor_strict", "--flor_lenient", "--flor_strong", "--flor_trust_pickles"}
#: bounds that no real run reaches: a value past them is a typo, refused before it reaches torch or a loop
MAX_EPOCHS = 10**9
MAX_THREADS = 1024
MAX_WORKERS = 10**6
#: how a replay worker ends, from the most to the least demanding (``Settings.verdict``)
VERDICTS = ("strict", "default", "lenient")
#: the trackers ``flor export`` and ``--flor_export`` write to (flor.export)
EXPORT_TARGETS = ("mlflow", "tensorboard", "wandb")


@dataclass(frozen=True)
class Settings:
    """What flor was asked to do in this process."""

    mode: str = "inert"  # "inert" | "record" | "replay"
    name: str | None = None
    home: Path = field(default_factory=lambda: _user_path("~/.flor"))
    pid: int = 0
    ngpus: int = 1
    placed_by: str = "default"  # where pid/ngpus came from
    run: str | None = None
    #: replay: "strict" (state that cannot be restored fails the worker), "default" (a divergence
    #: exits 3) or "lenient" (a divergence exits 0); --flor_strict/--flor_lenient are its aliases
    verdict: str = "default"
    strong: bool = False
    every: int | None = None  # None: adaptive, within the overhead budget
    overhead: float = 0.01
    replay_id: str | None = None
    spool: str | None = None  # s3://bucket/prefix
    spool_wait: float = 300.0
    spool_budget: int | None = None  # bytes of local blobs kept once spooled; None: keep all
    epoch_range: tuple[int, int | None] | None = None  # replay: only epochs [start, stop)
    threads: int | None = None  # replay: torch threads; None: the recorded count
    trust_pickles: bool = False  # replay: load pickled leaves also from manifests not signed with our key
    config_dir: Path = field(default_factory=lambda: _user_path("~/.config/flor"))  # holds the key
    debug: bool = False  # FLOR_DEBUG: show the traceback of a FlorError that ends the script
    flush_timeout: float = 20.0  # record: the exit waits this long for queued checkpoints (Slurm/k8s grace)
    writer_memory: int | None = None  # record: bytes of queued snapshots; None: min(1 GiB, 10% of RAM)
    malloc: str = "raise"  # FLOR_MALLOC: "raise" glibc's thresholds once (flor.malloc) or leave them at "default"
    rank_timeout: float = 600.0  # DDP: seconds ranks wait for rank 0 to name the run (rank 0 may still load data)
    notes: tuple[str, ...] = ()  # flags given that this mode does not use: said once at import
    export: tuple[str, ...] = ()  # replay: trackers its values are exported to at its end (--flor_export)
    export_error: str | None = None  # the flor command: why FLOR_EXPORT could not be read (said when used)

    @property
    def strict(self) -> bool:
        """``verdict == "strict"``: what ``--flor_strict`` asks for."""
        return self.verdict == "strict"

    @property
    def lenient(self) -> bool:
        """``verdict == "lenient"``: what ``--flor_lenient`` asks for."""
        return self.verdict == "lenient"

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
    if every > MAX_EPOCHS:
        raise ConfigError(f"{origin}: {text!r} epochs is more than any run has (at most {MAX_EPOCHS}); e.g. 5")
    return every


def parse_s3_url(url: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of ``s3://bucket/prefix``; ConfigError for anything else.

    >>> parse_s3_url("s3://my-bucket/team/flor/")
    ('my-bucket', 'team/flor')
    """
    if not isinstance(url, str) or not url.startswith("s3://"):
        raise ConfigError(f"spool target {url!r} is not an S3 URL; write s3://BUCKET/PREFIX, e.g. s3://my-bucket/flor")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not _BUCKET_RE.match(bucket) or ".." in bucket:
        raise ConfigError(
            f"spool target {url!r}: {bucket!r} is not a valid S3 bucket name (3-63 lowercase letters, "
            "digits, '.' or '-'); write s3://BUCKET/PREFIX"
        )
    prefix = prefix.strip("/")
    if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
        raise ConfigError(f"spool target {url!r}: the prefix {prefix!r} has an empty, '.' or '..' part")
    if any(ord(c) < 32 for c in prefix):
        raise ConfigError(f"spool target {url!r}: the prefix has control characters")
    return bucket, prefix


def parse_epoch_range(text: str, origin: str = "--flor_epochs") -> tuple[int, int | None]:
    """``(start, stop)`` of an epoch selection written as a Python slice; ``stop`` None: to the end.

    ``40:61`` is epochs 40 through 60, ``40:`` from 40 on, ``:10`` the first ten, ``7`` epoch 7 alone.

    >>> parse_epoch_range("40:61"), parse_epoch_range("7"), parse_epoch_range("5:")
    ((40, 61), (7, 8), (5, None))
    """
    m = re.match(r"^\s*(\d*)\s*(:?)\s*(\d*)\s*$", text or "")
    if not m or not (m.group(1) or m.group(3)) or (not m.group(2) and not m.group(1)):
        raise ConfigError(f"{origin}: {text!r} is not an epoch range; write A:B (epochs A..B-1, like a Python "
                          "slice), A: (from A on), :B (before B) or A (epoch A alone), e.g. 40:61")
    if any(len(g) > 9 for g in (m.group(1), m.group(3))):
        raise ConfigError(f"{origin}: {text!r} names an epoch past any recording (at most {MAX_EPOCHS - 1}); "
                          "epochs count from 0, e.g. 40:61")
    start = int(m.group(1) or 0)
    if not m.group(2):
        return start, start + 1
    stop = int(m.group(3)) if m.group(3) else None
    if stop is not None and stop <= start:
        raise ConfigError(f"{origin}: {text!r} selects no epoch: B must be greater than A in A:B "
                          "(B is excluded, like a Python slice), e.g. 40:61 for epochs 40 to 60")
    return start, stop


def _spool_settings(flags: Mapping[str, str | None], env: Mapping[str, str]) -> dict:
    """``spool``, ``spool_wait`` and ``spool_budget`` from ``--flor_spool`` and ``FLOR_SPOOL*``."""
    url = flags.get("--flor_spool") or env.get("FLOR_SPOOL") or None
    if url is not None:
        bucket, prefix = parse_s3_url(url.strip())
        url = f"s3://{bucket}/{prefix}".rstrip("/")
    out: dict = {"spool": url}
    wait = env.get("FLOR_SPOOL_WAIT")
    if wait is not None and wait.strip():
        try:
            out["spool_wait"] = float(wait)
        except ValueError:
            out["spool_wait"] = -1.0
        if not 0 <= out["spool_wait"] < 1e9:  # also nan and inf: the exit must stay bounded
            raise ConfigError(f"FLOR_SPOOL_WAIT={wait!r} is not a number of seconds; e.g. 600")
    budget = env.get("FLOR_SPOOL_BUDGET")
    if budget is not None and budget.strip():
        out["spool_budget"] = _parse_size(budget, "FLOR_SPOOL_BUDGET", "20GB, 500MB or 0")
    return out


def _parse_size(text: str, origin: str, example: str) -> int:
    """Bytes of a size written ``20GB``, ``500MB``, ``1.5GiB`` or ``4096``."""
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", text, re.IGNORECASE)
    if not m:
        raise ConfigError(f"{origin}={text!r} is not a size; write e.g. {example}")
    unit = (m.group(2) or "B").upper().rstrip("B") or "B"
    scale = {"B": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
             "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}[unit]
    value = float(m.group(1)) * scale
    if not value < 2**62:  # also inf, from hundreds of digits
        raise ConfigError(f"{origin}={text!r} is larger than any disk; write e.g. {example}")
    return int(value)


def _writer_settings(env: Mapping[str, str]) -> dict:
    """``flush_timeout`` and ``writer_memory`` from ``FLOR_FLUSH_TIMEOUT`` and ``FLOR_WRITER_MEMORY``."""
    out: dict = {}
    timeout = env.get("FLOR_FLUSH_TIMEOUT")
    if timeout is not None and timeout.strip():
        try:
            value = float(timeout)
        except ValueError:
            value = -1.0
        if not 0 <= value < 1e9:  # also rejects nan and inf: the exit must stay bounded
            raise ConfigError(f"FLOR_FLUSH_TIMEOUT={timeout!r} is not a number of seconds >= 0; e.g. 20 "
                              "(keep it inside the grace period your scheduler gives after SIGTERM)")
        out["flush_timeout"] = value
    memory = env.get("FLOR_WRITER_MEMORY")
    if memory is not None and memory.strip():
        out["writer_memory"] = _parse_size(memory, "FLOR_WRITER_MEMORY", "512MB or 2GiB")
        if out["writer_memory"] < 1:
            raise ConfigError(f"FLOR_WRITER_MEMORY={memory!r} leaves no memory for checkpoints; write e.g. 512MB")
    return out


def _rank_timeout(env: Mapping[str, str]) -> float:
    """``FLOR_RANK_TIMEOUT``: seconds a DDP rank waits for rank 0 to name the run (600 unset or empty)."""
    text = env.get("FLOR_RANK_TIMEOUT")
    if text is None or not text.strip():
        return 600.0
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1e9:  # also nan and inf: a rank must not wait forever for a rank 0 that died
        raise ConfigError(f"FLOR_RANK_TIMEOUT={text!r} is not a number of seconds > 0; write e.g. "
                          "FLOR_RANK_TIMEOUT=600 (how long the ranks of a DDP run wait for rank 0 to name the "
                          "run, which may still be loading data), or unset it")
    return value


#: the verdict each of its flags and variables sets, in the order they are named in errors
_VERDICT_FLAGS = ("--flor_verdict", "--flor_strict", "--flor_lenient")
VERDICT_VARIABLES = ("FLOR_VERDICT", "FLOR_STRICT", "FLOR_LENIENT")


def _verdict(flags: Mapping[str, str | None], env: Mapping[str, str]) -> str:
    """``Settings.verdict`` from ``--flor_verdict`` and its aliases ``--flor_strict`` and
    ``--flor_lenient``, else from ``FLOR_VERDICT``, ``FLOR_STRICT`` and ``FLOR_LENIENT``: any of
    the flags wins over all of the variables; within one of them, two verdicts are an error.

    >>> _verdict({"--flor_lenient": "1"}, {"FLOR_STRICT": "1"})
    'lenient'
    >>> _verdict({"--flor_verdict": "strict", "--flor_strict": "1"}, {})
    'strict'
    >>> _verdict({"--flor_verdict": "lenient", "--flor_strict": "1"}, {})
    Traceback (most recent call last):
    flor.errors.ConfigError: --flor_verdict lenient and --flor_strict contradict each other: ...
    """
    given = {k: v for k, v in flags.items() if k in _VERDICT_FLAGS}
    if given:
        values, forms = given, ("--flor_verdict {}", "--flor_strict", "--flor_lenient")
    else:
        values = {k: env[k] for k in VERDICT_VARIABLES if (env.get(k) or "").strip()}
        forms = ("FLOR_VERDICT={}", "FLOR_STRICT=1", "FLOR_LENIENT=1")
    said: dict[str, str] = {}  # verdict -> how it was asked for, in the order of the names
    for flag, var, form, alias in zip(_VERDICT_FLAGS, VERDICT_VARIABLES, forms, (None, "strict", "lenient")):
        name = flag if given else var
        if name not in values:
            continue
        text = values[name] or ""
        if alias is None:
            verdict = text.strip().lower()
            if verdict not in VERDICTS:
                raise ConfigError(f"{name}={text!r} is not a verdict: write {form.format('strict')}, default or "
                                  "lenient (strict also fails on state a replay cannot restore; default exits 3 "
                                  "when values diverged; lenient exits 0 then)")
            said.setdefault(verdict, form.format(verdict))
        elif _parse_bool(text, f"{flag}/{var}"):
            said.setdefault(alias, form)
    if len(said) > 1:
        (first, one), (second, other) = list(said.items())[:2]
        fix = "give one of them" if given else "unset all but one"
        raise ConfigError(f"{one} and {other} contradict each other: they ask for the verdicts {first} and "
                          f"{second} (strict fails on what lenient lets pass); {fix} "
                          f"({'--flor_verdict ' if given else 'FLOR_VERDICT='}strict, default or lenient)")
    return next(iter(said), "default")


def _malloc(env: Mapping[str, str]) -> str:
    """``FLOR_MALLOC``: ``raise`` (unset or empty too) or ``default``."""
    text = env.get("FLOR_MALLOC") or ""
    value = text.strip().lower() or "raise"
    if value not in ("raise", "default"):
        raise ConfigError(f"FLOR_MALLOC={text!r} is not a malloc setting: write FLOR_MALLOC=default to leave "
                          "glibc's malloc thresholds as they are, or unset it (flor raises them once)")
    return value


def _user_path(text: str) -> Path:
    """``text`` with ``~`` expanded; a ConfigError, not a RuntimeError, where no home directory can
    be found (``HOME`` unset and this uid without a passwd entry: containers run with any uid)."""
    try:
        return Path(text).expanduser()
    except (RuntimeError, KeyError) as exc:
        raise ConfigError(f"cannot find your home directory for {text} (HOME is unset and uid {os.getuid()} has no "
                          "passwd entry): set HOME, or FLOR_HOME and FLOR_CONFIG_DIR") from exc


#: what an inert process holds for its store and config folders where no home directory can be found
_INERT_HOME = Path("~/.flor")
_INERT_CONFIG = Path("~/.config/flor")


def _config_dir(env: Mapping[str, str]) -> Path:
    """flor's config folder (the HMAC key lives there): ``FLOR_CONFIG_DIR``, else
    ``$XDG_CONFIG_HOME/flor``, else ``~/.config/flor``."""
    text = env.get("FLOR_CONFIG_DIR") or ""
    if not text.strip():
        xdg = env.get("XDG_CONFIG_HOME") or ""
        text = str(Path(xdg) / "flor") if xdg.strip() and Path(xdg).is_absolute() else "~/.config/flor"
    path = _user_path(text)
    return path if path.is_absolute() else Path.cwd() / path


def _home(env: Mapping[str, str]) -> Path:
    home = _user_path(env.get("FLOR_HOME") or "~/.flor")
    return home if home.is_absolute() else Path.cwd() / home


def _command_settings(env: Mapping[str, str]) -> Settings:
    """The ``flor`` command's settings: the store root and spool, from the environment only.

    A malformed FLOR_SPOOL is kept as given: only ``flor spool`` and ``flor pull`` use it,
    and they report it; ``flor ls`` still works.
    """
    try:
        spool = _spool_settings({}, env)
    except ConfigError:
        spool = {"spool": env.get("FLOR_SPOOL") or None}
    try:  # `flor replay --export` takes it; a malformed one fails there, not `flor ls`
        export, export_error = parse_export(env.get("FLOR_EXPORT") or "", "FLOR_EXPORT"), None
    except ConfigError as exc:
        export, export_error = (), str(exc)
    return Settings(home=_home(env), config_dir=_config_dir(env), export=export, export_error=export_error, **spool)


def _parse_overhead(text: str, origin: str) -> float:
    try:
        value = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise ConfigError(f"{origin}: {text!r} is not a fraction of training time in (0, 1]; e.g. 0.01 or 1%")
    return value


def parse_export(text: str, origin: str = "--flor_export/FLOR_EXPORT") -> tuple[str, ...]:
    """The trackers named by ``mlflow,wandb`` (empty: none); a ConfigError names an unknown one.

    >>> parse_export("mlflow, tensorboard"), parse_export("")
    (('mlflow', 'tensorboard'), ())
    """
    targets = tuple(dict.fromkeys(t.strip().lower() for t in text.split(",") if t.strip()))
    unknown = [t for t in targets if t not in EXPORT_TARGETS]
    if unknown:
        raise ConfigError(f"{origin}: {unknown[0]!r} is not a tracker flor exports to; give one of "
                          f"{', '.join(EXPORT_TARGETS)} (several joined by commas)")
    return targets


def _parse_threads(text: str) -> int:
    threads = int(text) if text.strip().isdigit() and len(text.strip()) < 10 else 0
    if not 1 <= threads <= MAX_THREADS:
        raise ConfigError(f"--flor_threads/FLOR_THREADS: {text!r} is not a number of threads from 1 to "
                          f"{MAX_THREADS}; e.g. 2")
    return threads


#: flags that one mode takes and the other has no use for
_REPLAY_ONLY = ("--flor_run", "--flor_epochs", "--flor_threads", "--flor_verdict", "--flor_strict", "--flor_lenient",
                "--flor_strong", "--flor_trust_pickles", "--flor_export")
_RECORD_ONLY = ("--flor_every", "--flor_overhead")


def _ignored_flags(flags: Mapping[str, str | None], mode: str) -> tuple[str, ...]:
    """One note per well-formed flag on the command line that ``mode`` does not use (the
    variables are left alone: a job may export them for its record and replay alike)."""
    unused, other, this = (_REPLAY_ONLY, "replays", "recording") if mode == "record" else \
        (_RECORD_ONLY, "recordings", "replay")
    return tuple(f"{flag} applies to {other} only; this {this} ignores it" for flag in unused if flag in flags)


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
            elif i + 1 < len(argv) and (not argv[i + 1].startswith("-") or re.match(r"^-\d", argv[i + 1])):
                # a negative number is a value (refused by its own check, which names it), not a flag
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
            _not_a_typo(flag, word)
            rest.append(word)  # the script's own flag (--flor_x): flor's flags are the ones it knows
        i += 1
    return found, rest


def strip_flor_flags(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """``args`` (a script's arguments, no argv[0]) without any of flor's flags, and the words
    taken out. A sweep replays each run with its recorded arguments, and those are data from a
    store: flor's settings come from the user's own command line and environment only, so a
    ``--flor_trust_pickles`` or ``--flor_spool s3://elsewhere`` planted there is never applied.
    Every word that starts like one of flor's flags goes (with the next word as its value where
    the flag takes one); words after ``--`` are the script's and stay.

    >>> strip_flor_flags(["--lr", "0.1", "--flor_spool", "s3://x/y", "--flor_trust_pickles", "--", "--flor_x"])
    (['--lr', '0.1', '--', '--flor_x'], ['--flor_spool', 's3://x/y', '--flor_trust_pickles'])
    """
    kept: list[str] = []
    dropped: list[str] = []
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            kept.extend(args[i:])
            break
        flag, eq, _ = word.partition("=")
        if flag == "--flor" or flag.startswith("--flor_") or flag == "--replay_flor":
            dropped.append(word)
            takes = flag in _VALUE_FLAGS or (flag == "--replay_flor" and i + 1 < len(args)
                                              and _SEGMENT_RE.match(args[i + 1]) is not None)
            if takes and not eq and i + 1 < len(args):
                dropped.append(args[i + 1])
                i += 1
        else:
            kept.append(word)
        i += 1
    return kept, dropped


def _not_a_typo(flag: str, word: str) -> None:
    """A ConfigError for an unknown ``--flor_*`` flag that is one of flor's misspelled
    (``--flor_strct``); any other is left to the script, whose own parser judges it.

    >>> _not_a_typo("--flor_x", "--flor_x=3")
    >>> _not_a_typo("--flor_epoch", "--flor_epoch")
    Traceback (most recent call last):
    flor.errors.ConfigError: unknown flor flag '--flor_epoch': did you mean --flor_epochs? ...
    """
    import difflib

    known = sorted(_VALUE_FLAGS | _SWITCH_FLAGS | {"--replay_flor"})
    suffixes = {k.removeprefix("--flor_"): k for k in known if k.startswith("--flor_")}
    close = difflib.get_close_matches(flag.removeprefix("--flor_"), list(suffixes), n=1, cutoff=0.75)
    if close:
        raise ConfigError(f"unknown flor flag {word!r}: did you mean {suffixes[close[0]]}? The flags are "
                          f"{', '.join(known)} (a flag of the script's own may not look like one of them)")


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

    verdict = _verdict(flags, env)
    strong = _parse_bool(flags.get("--flor_strong") or env.get("FLOR_STRONG", "0"), "--flor_strong/FLOR_STRONG")
    rank_timeout = _rank_timeout(env)
    debug = _parse_bool(env.get("FLOR_DEBUG", "0"), "FLOR_DEBUG")
    malloc = _malloc(env)
    trust: dict[str, Any] = {"config_dir": _INERT_CONFIG, "trust_pickles": _parse_bool(
        flags.get("--flor_trust_pickles") or env.get("FLOR_TRUST_PICKLES", "0"),
        "--flor_trust_pickles/FLOR_TRUST_PICKLES")}
    every_text = flags.get("--flor_every") or env.get("FLOR_EVERY") or None  # empty: unset, as the others
    every = _parse_every(every_text, "--flor_every/FLOR_EVERY") if every_text is not None else None
    overhead_text = flags.get("--flor_overhead") or env.get("FLOR_OVERHEAD")
    overhead = _parse_overhead(overhead_text, "--flor_overhead/FLOR_OVERHEAD") if overhead_text else 0.01
    run = flags.get("--flor_run") or env.get("FLOR_RUN") or None
    spool = _spool_settings(flags, env)
    # replay-only values are checked in every mode: a typo fails the same way whether recording or replaying
    epochs_text = flags.get("--flor_epochs") or env.get("FLOR_EPOCHS") or None
    epoch_range = parse_epoch_range(epochs_text, "--flor_epochs/FLOR_EPOCHS") if epochs_text else None
    threads_text = flags.get("--flor_threads") or env.get("FLOR_THREADS") or None
    threads = _parse_threads(threads_text) if threads_text is not None else None
    export = parse_export(flags.get("--flor_export") or env.get("FLOR_EXPORT") or "")

    if name is None:
        if replay:
            raise ConfigError(
                f"{replay_origin} needs an experiment to replay: add --flor NAME (or set FLOR_NAME)"
            )
        # inert: nothing is read or made; where no home directory can be found (HOME unset, a uid without a
        # passwd entry) the paths stay unexpanded: only the `flor` command, run as `python -m flor`, reads them
        try:
            home, config_dir = _home(env), _config_dir(env)
        except ConfigError:
            home, config_dir = _INERT_HOME, _INERT_CONFIG
        inert = Settings(mode="inert", home=home, debug=debug, config_dir=config_dir, malloc=malloc, **spool)
        return inert, rest
    validate_name(name)
    home = _home(env)
    trust["config_dir"] = _config_dir(env)

    notes = _ignored_flags(flags, "replay" if replay else "record")
    if not replay:
        return Settings(mode="record", name=name, home=home, every=every, overhead=overhead, verdict=verdict,
                        debug=debug, config_dir=trust["config_dir"], malloc=malloc, notes=notes,
                        rank_timeout=rank_timeout, **spool, **_writer_settings(env)), rest

    if replay_value is not None and replay_value.strip().lower() not in ("", "all"):
        pid, ngpus = parse_segment(replay_value, replay_origin)
        placed_by = replay_origin
    else:
        pid, ngpus, placed_by = worker_place(env)
    if ngpus > MAX_WORKERS:
        raise ConfigError(f"{placed_by} asks for {ngpus} replay workers, more than flor supports ({MAX_WORKERS}); "
                          "e.g. --replay_flor 0/8")
    if run is not None and not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", run):
        raise ConfigError(f"invalid run id {run!r}; `flor ls {name}` lists the runs")
    replay_id = env.get("FLOR_REPLAY_ID") or None
    if replay_id is not None and not re.match(r"^[A-Za-z0-9._-]{1,64}$", replay_id):
        raise ConfigError(f"FLOR_REPLAY_ID={replay_id!r} must be letters, digits, '.', '_' or '-'")
    if replay_id is None:
        replay_id = shared_replay_id(env, placed_by)
    return (
        Settings(
            mode="replay", name=name, home=home, pid=pid, ngpus=ngpus, placed_by=placed_by,
            run=run, verdict=verdict, strong=strong, replay_id=replay_id, epoch_range=epoch_range,
            threads=threads, debug=debug, malloc=malloc, notes=notes, rank_timeout=rank_timeout, export=export,
            **trust, **spool,
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
        try:
            return _command_settings(os.environ)  # the flor command itself: its arguments are its own
        except ConfigError as exc:
            print(f"flor: error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
    try:
        settings, rest = parse(sys.argv, os.environ)
    except ConfigError as exc:
        print(f"flor: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except (ValueError, OverflowError, TypeError) as exc:  # a value no check above foresaw: still one line
        print(f"flor: error: cannot read flor's flags and FLOR_* variables ({exc}); check their values "
              "(the docstring of flor.settings lists them)", file=sys.stderr)
        raise SystemExit(2) from None
    sys.argv[:] = rest
    for note in settings.notes:
        print(f"flor: FL002 {note}", file=sys.stderr)
    return settings


SETTINGS: Settings = _from_process()
