"""``run.json``, typed: what a recording says about itself (DESIGN.md §3).

The recording writes it at the start, after every epoch and at exit; everything else reads
it through ``RunMeta.from_json``, which checks every field it knows (a store may be shared,
so run.json is untrusted input: a damaged one is a ``StorageError`` naming the file and the
field, never an AttributeError later). Fields this version does not know are kept as they
are in ``extra`` and written back unchanged.
"""

from __future__ import annotations

import dataclasses
import math
import socket
from dataclasses import dataclass, field
from typing import Any

from ..errors import StorageError
from ..placement import pid_alive

__all__ = ["FORMAT", "RunMeta", "STATUSES"]

#: the run.json format this flor writes and reads. 2 (flor 0.1.0): the recording watches in-place
#: changes outside the blocks ("outside" in logs/block-state.jsonl), notes the loop variables it
#: had not changed ("unchanged" in logs/outer-state.jsonl), and writes manifests of
#: ``flor.store.manifest.FORMAT``. An earlier format is refused (``RunMeta.from_json``).
FORMAT = 2

STATUSES = ("running", "finished", "crashed", "interrupted", "terminated")

#: the most torch threads a recording may ask a replay for (a damaged value must not reach torch)
MAX_THREADS = 4096
_NUM = (int, float)
#: bounds on the numbers of run.json that no real run reaches (a store is anyone's to write): a number
#: past its bound makes the run a named damaged one, never a traceback (a date of 1e308) or an endless
#: loop (10**15 epochs to plan) in a reader
MAX_TIME = 1e11  # Unix seconds: the year 5138
MAX_EPOCHS_DONE = 10**6
MAX_INT = 2**63
_BOUNDS: dict[str, tuple[float, float]] = {
    "started": (0, MAX_TIME), "ended": (0, MAX_TIME), "process_started": (0, MAX_TIME), "busy_cores": (0, 1e6),
    "pid": (0, 2**31), "torch_threads": (-MAX_INT, MAX_INT), "epochs_planned": (0, MAX_INT),
    "checkpoint_every": (-MAX_INT, MAX_INT), "exit_code": (-2**31, 2**31), "epochs_done": (0, MAX_EPOCHS_DONE),
    "world_size": (0, 10**6),
}


def _bounded(value: Any, name: str, where: str) -> Any:
    """``value`` when it is None or a finite number within the bounds of ``name``; else a StorageError."""
    if value is None or name not in _BOUNDS:
        return value
    low, high = _BOUNDS[name]
    if not (isinstance(value, int) or math.isfinite(value)) or not low <= value <= high:
        raise StorageError(f"{where}: {name} is {value!r:.40}, out of range ({low:g} to {high:g}); the file is "
                           "damaged or planted")
    return value


def _check(value: Any, kinds: tuple[type, ...] | type, name: str, where: str, *, optional: bool = True) -> Any:
    if value is None and optional:
        return None
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise StorageError(f"{where}: {name} is {value!r}, expected {_kind_name(kinds)}; the file is damaged")
    if not isinstance(value, kinds):
        raise StorageError(f"{where}: {name} is {type(value).__name__} {value!r:.60}, expected {_kind_name(kinds)}; "
                           "the file is damaged")
    return value


def _kind_name(kinds: tuple[type, ...] | type) -> str:
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    return " or ".join(k.__name__ for k in kinds)


@dataclass
class RunMeta:
    """One recording's metadata. Times are Unix seconds; epochs count from 0."""

    name: str
    run: str
    status: str = "running"
    format: int = FORMAT
    pid: int | None = None
    argv: list[str] = field(default_factory=list)
    cwd: str | None = None
    script: str | None = None
    script_sha256: str | None = None
    git: dict[str, Any] | None = None
    versions: dict[str, Any] = field(default_factory=dict)
    torch_threads: int | None = None
    started: float | None = None
    ended: float | None = None
    process_started: float | None = None
    busy_cores: float | None = None
    epochs_planned: int | None = None  # len() of the loop, when it has one
    epochs_done: int = 0  # epochs whose body ran to its end (a `break` ends the last one)
    loop_ended: str | None = None  # how the epoch loop ended: "completed", "break" (stopped early), "error"
    epoch_blocks: dict[str, list] = field(default_factory=dict)  # epoch -> [[block, occurrence, checkpointed]]
    outside_blocks: list[list] = field(default_factory=list)
    checkpoint_failures: list[dict] = field(default_factory=list)
    #: checkpoints not taken or not finished, with why: {epoch, block, reason} ("writer behind":
    #: the background writer's memory was full; "exit flush timed out": abandoned at exit)
    checkpoint_skipped: list[dict] = field(default_factory=list)
    #: writes that failed on the training thread, by kind (run.json, logs, stdout, source, ...): the
    #: run went on without them; written as soon as a later write of run.json succeeds
    write_failures: dict[str, int] = field(default_factory=dict)
    checkpoint_policy: dict[str, Any] | None = None
    checkpoint_every: int | None = None
    timings: dict[str, Any] = field(default_factory=lambda: {"epoch_s": [], "blocks": {}})
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    spool: str | None = None
    world_size: int = 1
    rank_mismatches: list = field(default_factory=list)
    #: blocks whose second run added to the gradients the first left: from then on their
    #: checkpoints keep the modules' gradients (flor.state.grads)
    grads_carried: list = field(default_factory=list)
    background: dict[str, Any] | None = None
    error: str | None = None
    #: the status the script asked for when it ended through ``sys.exit(n)`` or ``SystemExit(n)``
    #: (a message counts as 1); absent otherwise (flor.engine.exits)
    exit_code: int | None = None
    #: the trackers the script reported to, as the recording saw them (flor.engine.trackers): ``mlflow``
    #: {run_id, tracking_uri, experiment_id}, ``wandb`` {entity, project, id, dir, mode}, ``tensorboard``
    #: {logdirs}; what ``flor export`` writes into
    trackers: dict[str, Any] = field(default_factory=dict)
    #: the user's key's signature of ``argv`` and the source copy (``flor.store.trust.sign_run``):
    #: a sweep runs them only when signed by a key the user trusts
    signature: dict[str, Any] | None = None
    #: the user's key's signature of ``trackers`` (``flor.store.trust.sign_trackers``): ``flor export``
    #: writes into a recorded destination only when a key the user trusts signed it
    trackers_signature: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def epochs(self) -> int:
        """How many epochs a replay of this run covers: exactly those the recording ran.

        The one place that decides it (plans, ``flor show``, ``--plan``, the launcher). A run
        that stopped early (a ``break``: early stopping), crashed or was interrupted after
        ``epochs_done`` of ``epochs_planned`` epochs is replayed up to where it stopped; a
        run still recording, up to the epochs it has finished so far.

        >>> RunMeta("x", "r", status="finished", epochs_planned=6, epochs_done=3).epochs
        3
        """
        return int(self.epochs_done or 0)

    @property
    def stopped_early(self) -> bool:
        """The loop ended before its planned length (a ``break``, a crash, an interrupt)."""
        return self.status != "running" and self.epochs_planned is not None and self.epochs_done < self.epochs_planned

    def process_gone(self) -> bool:
        """Whether the run says ``running`` but its recording process, which ran on this host, no
        longer exists: it was killed (SIGKILL, the OOM killer) or left by ``os._exit``, so no exit
        hook wrote its status. False where that cannot be known (another host, no pid). run.json
        is left as it is; a replay of such a run says the same (flor.engine.replay)."""
        if self.status != "running" or not isinstance(self.pid, int) or self.pid <= 0:
            return False
        host = self.versions.get("host") if isinstance(self.versions, dict) else None
        if host is not None and host != socket.gethostname():
            return False
        return not pid_alive(self.pid)

    def status_text(self) -> str:
        """The status as ``flor ls`` and ``flor show`` print it: ``crashed (exit 3)`` for a
        ``sys.exit(3)``, ``running (process gone)`` for a recording killed on this host.

        >>> RunMeta("x", "r", status="crashed", exit_code=3).status_text()
        'crashed (exit 3)'
        """
        if self.process_gone():
            return "running (process gone)"
        if self.exit_code is not None and self.exit_code != 0:
            return f"{self.status} (exit {self.exit_code})"
        return self.status

    def epochs_text(self) -> str:
        """``3 of 6 planned (stopped early)``, ``6 of 6 done``, ``2 of 6 done so far (running)``: how
        many epochs ran.

        >>> RunMeta("x", "r", status="finished", epochs_planned=6, epochs_done=3, loop_ended="break").epochs_text()
        '3 of 6 planned (stopped early)'
        """
        done, planned = self.epochs_done, self.epochs_planned
        text = f"{done}" + (f" of {planned}" if planned is not None else "")
        if self.process_gone():
            return text + " done (its process is gone)"
        if self.status == "running":
            return text + " done so far (running)"
        if self.stopped_early:
            why = "stopped early" if self.status == "finished" else self.status
            return f"{text} planned ({why})"
        return text + " done"

    @property
    def threads(self) -> int | None:
        """The recording's torch thread count, when it is one a replay may apply."""
        t = self.torch_threads
        return t if t is not None and 1 <= t <= MAX_THREADS else None

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        return {**self.extra, **out}

    @classmethod
    def from_json(cls, obj: Any, where: str = "run.json") -> RunMeta:
        """Check and type a parsed run.json; ``where`` names it in errors. A run.json of an
        earlier format (flor before 0.1.0) is refused, not read with fallbacks.

        >>> RunMeta.from_json({"name": "x", "run": "r", "format": 1}, "runs/r/run.json")
        Traceback (most recent call last):
        flor.errors.StorageError: runs/r/run.json: recorded by flor older than 0.1.0 (format 1); record again: ...
        """
        if not isinstance(obj, dict):
            raise StorageError(f"{where}: expected a JSON object, found {type(obj).__name__}; the file is "
                               "damaged")
        fmt = obj.get("format")
        if type(fmt) is int and 1 <= fmt < FORMAT:
            raise StorageError(f"{where}: recorded by flor older than 0.1.0 (format {fmt}); record again: this "
                               f"flor reads run.json format {FORMAT} only")
        if type(fmt) is int and FORMAT < fmt < 1000:
            raise StorageError(f"{where}: written by a newer flor (format {fmt}; this flor reads format {FORMAT}): "
                               "upgrade flor to read it")
        if fmt != FORMAT or type(fmt) is not int:
            raise StorageError(f"{where}: format is {fmt!r:.20}, not a run.json format; the file is damaged")
        known = {f.name: f for f in dataclasses.fields(cls) if f.name != "extra"}
        kw: dict[str, Any] = {"extra": {k: v for k, v in obj.items() if k not in known}, "format": fmt}
        kw["name"] = _check(obj.get("name"), str, "name", where, optional=False)
        kw["run"] = _check(obj.get("run"), str, "run", where, optional=False)
        kw["status"] = _check(obj.get("status", "running"), str, "status", where, optional=False)
        if kw["status"] not in STATUSES:
            raise StorageError(f"{where}: status {kw['status']!r} is not one of {', '.join(STATUSES)}")
        ints = ("pid", "torch_threads", "epochs_planned", "checkpoint_every", "exit_code")
        for name in ints:
            if name in obj:
                kw[name] = _check(obj[name], int, name, where)
        kw["epochs_done"] = _check(obj.get("epochs_done", 0), int, "epochs_done", where, optional=False)
        kw["world_size"] = _check(obj.get("world_size", 1) or 1, int, "world_size", where, optional=False)
        for name in ("epochs_planned", "epochs_done", "world_size"):
            if kw.get(name) is not None and kw[name] < 0:
                raise StorageError(f"{where}: {name} is negative ({kw[name]})")
        for name in ("started", "ended", "process_started", "busy_cores"):
            if name in obj:
                kw[name] = _check(obj[name], _NUM, name, where)
        for name in ("cwd", "script", "script_sha256", "spool", "error", "loop_ended"):
            if name in obj:
                kw[name] = _check(obj[name], str, name, where)
        for name in ("git", "checkpoint_policy", "background", "signature", "trackers_signature"):
            if name in obj:
                kw[name] = _check(obj[name], dict, name, where)
        for name in ("versions", "epoch_blocks", "timings", "hyperparameters", "metrics", "write_failures", "trackers"):
            if name in obj:
                kw[name] = _check(obj[name], dict, name, where, optional=False)
        for name in ("argv", "outside_blocks", "checkpoint_failures", "checkpoint_skipped", "rank_mismatches",
                     "grads_carried"):
            if name in obj:
                kw[name] = _check(obj[name], list, name, where, optional=False)
        for name in ("argv", "grads_carried"):
            if not all(isinstance(a, str) for a in kw.get(name, [])):
                raise StorageError(f"{where}: {name} holds a value that is not a string")
        for name in _BOUNDS:
            _bounded(kw.get(name), name, where)
        epoch_s = kw.get("timings", {}).get("epoch_s", [])
        if not isinstance(epoch_s, list) or not all(
                isinstance(t, _NUM) and not isinstance(t, bool) and math.isfinite(t) and 0 <= t <= MAX_TIME
                for t in epoch_s):
            raise StorageError(f"{where}: timings.epoch_s is not a list of epoch durations in seconds; the file is "
                               "damaged or planted")
        for epoch, blocks in kw.get("epoch_blocks", {}).items():
            if not epoch.isdigit() or not isinstance(blocks, list):
                raise StorageError(f"{where}: epoch_blocks[{epoch!r}] is not a list of blocks of an epoch")
        for tracker, note in kw.get("trackers", {}).items():
            if not isinstance(note, dict):
                raise StorageError(f"{where}: trackers[{tracker!r}] is not an object; the file is damaged")
        return cls(**kw)
