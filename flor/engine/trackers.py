"""The script's own trackers (MLflow, W&B, TensorBoard's ``SummaryWriter``): noted while recording,
kept quiet while replaying.

Recording, ``seen`` reads where the script reports: the active MLflow run (its id and tracking
URI), the W&B run (entity, project, id) and the logdirs of ``SummaryWriter`` objects the loop's
frame holds. It looks only at modules the script imported itself (``sys.modules``): flor never
imports a tracker, and never makes one start a run. ``flor export`` writes into what it noted.

Replaying, ``quiet_trackers`` makes the script's own tracker calls harmless, guarded with
``flor.replaying()`` or not: MLflow's fluent calls (``start_run``, ``log_metric``, ...) do
nothing and create no run, ``wandb.init`` runs with ``mode="disabled"``, and a ``SummaryWriter``
writes into the replay's own folder (``tb/replay-<id>/script-<worker>``) rather than the
script's logdir. A tracker imported after flor is quieted when it is imported (an import hook).
Hindsight values reach a tracker only through ``flor export`` (or ``--flor_export``), once.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any, Callable, Sequence

from ..errors import FlorError
from ..settings import Settings
from ..store import ExperimentStore
from ..store.runmeta import RunMeta
from ..store.trust import sign_trackers

__all__ = ["MLFLOW_QUIET", "TrackerHook", "export_at_end", "note_trackers", "quiet_trackers", "recorded_mlflow_run",
           "seen"]


def note_trackers(meta: RunMeta, frame: FrameType | None, config_dir: Path) -> None:
    """Where the script reports (an MLflow or W&B run, SummaryWriter logdirs, ``seen`` from
    ``frame``): into run.json (``meta.trackers``), for ``flor export``, signed when it changed."""
    before = dict(meta.trackers)
    for name, note in seen(frame).items():
        if name == "tensorboard":  # every logdir seen, in order
            old = meta.trackers.get(name, {}).get("logdirs", [])
            note = {"logdirs": list(dict.fromkeys([*old, *note["logdirs"]]))}
        meta.trackers[name] = note
    if meta.trackers != before:  # a destination flor export may write into: signed, as argv is
        meta.trackers_signature = sign_trackers(config_dir, meta.trackers)


def seen(frame: FrameType | None) -> dict[str, dict[str, Any]]:
    """The trackers the script reports to now: ``{"mlflow": {...}, "wandb": {...}, "tensorboard": {...}}``.

    Never raises and never imports: a tracker the script did not import is not looked at.
    """
    out: dict[str, dict[str, Any]] = {}
    for name, probe in (("mlflow", _mlflow), ("wandb", _wandb), ("tensorboard", _tensorboard)):
        try:
            note = probe(frame)
        except Exception:  # noqa: BLE001 - a tracker's odd state must never reach training
            note = None
        if note:
            out[name] = note
    return out


def _mlflow(frame: FrameType | None) -> dict[str, Any] | None:
    mlflow = sys.modules.get("mlflow")
    if mlflow is None or not hasattr(mlflow, "active_run"):
        return None
    run = mlflow.active_run()
    if run is None:
        return None
    return {"run_id": run.info.run_id, "experiment_id": run.info.experiment_id,
            "tracking_uri": absolute_uri(str(mlflow.get_tracking_uri()))}


def absolute_uri(uri: str, cwd: str | None = None) -> str:
    """A tracking URI that still names the same store from another folder: a relative SQLite
    path or plain folder made absolute against ``cwd`` (default: this process's).

    >>> absolute_uri("sqlite:///mlflow.db", "/work")
    'sqlite:////work/mlflow.db'
    >>> absolute_uri("http://127.0.0.1:5000", "/work")
    'http://127.0.0.1:5000'
    """
    cwd = cwd or os.getcwd()
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + os.path.join(cwd, uri[len("sqlite:///"):])
    if uri.startswith("file:") and not uri.startswith("file:/"):
        return "file://" + os.path.join(cwd, uri[len("file:"):])
    if "://" not in uri and not uri.startswith("databricks") and not os.path.isabs(uri):
        return os.path.join(cwd, uri)
    return uri


def _wandb(frame: FrameType | None) -> dict[str, Any] | None:
    wandb = sys.modules.get("wandb")
    run = getattr(wandb, "run", None) if wandb is not None else None
    if run is None:
        return None
    settings = getattr(run, "settings", None)
    mode = str(getattr(settings, "mode", "") or "")
    if mode == "disabled":
        return None
    return {"entity": getattr(run, "entity", None) or None, "project": getattr(run, "project", None) or None,
            "id": run.id, "dir": str(getattr(settings, "root_dir", "") or os.getcwd()), "mode": mode or None}


def _tensorboard(frame: FrameType | None) -> dict[str, Any] | None:
    module = sys.modules.get("torch.utils.tensorboard.writer")
    writer_cls = getattr(module, "SummaryWriter", None)
    if writer_cls is None or frame is None:
        return None
    logdirs: list[str] = []
    spaces = [frame.f_locals, frame.f_globals]
    for space in spaces:
        for value in list(space.values()):
            if isinstance(value, writer_cls):
                logdir = os.path.abspath(str(value.get_logdir()))
                if logdir not in logdirs:
                    logdirs.append(logdir)
    return {"logdirs": logdirs} if logdirs else None


# -- replay: the script's tracker calls do nothing ----------------------------------------------

#: MLflow's fluent functions that a replay makes do nothing (those that create, change or end runs,
#: experiments and what they hold); ``start_run`` returns a run that is no run
MLFLOW_QUIET = ("autolog", "delete_tag", "end_run", "log_artifact", "log_artifacts", "log_dict", "log_figure",
                "log_image", "log_input", "log_inputs", "log_metric", "log_metrics", "log_outputs", "log_param",
                "log_params", "log_table", "log_text", "set_experiment", "set_experiment_tag",
                "set_experiment_tags", "set_tag", "set_tags", "set_tracking_uri", "start_run")


class _NoInfo:
    def __init__(self, run_id: Callable[[], str | None]) -> None:
        self._run_id = run_id
        self.run_name = "flor-replay"
        self.experiment_id = "0"
        self.status = "RUNNING"
        self.artifact_uri = ""

    @property
    def run_id(self) -> str:
        return self._run_id() or "flor-replay"

    run_uuid = run_id


class _NoRun:
    """What a replayed ``mlflow.start_run()`` returns: a context manager with ``info.run_id`` (the
    recorded run's, when flor noted one), and no run behind it."""

    def __init__(self, run_id: Callable[[], str | None]) -> None:
        self.info = _NoInfo(run_id)
        self.data = None

    def __enter__(self) -> _NoRun:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def _quiet_mlflow(module: ModuleType, run_id: Callable[[], str | None]) -> None:
    no_run = _NoRun(run_id)

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    def start_run(*args: Any, **kwargs: Any) -> _NoRun:
        return no_run

    targets = [module, sys.modules.get("mlflow.tracking.fluent")]
    for target in targets:
        if target is None:
            continue
        for name in MLFLOW_QUIET:
            if hasattr(target, name):
                setattr(target, name, start_run if name == "start_run" else nothing)
        if hasattr(target, "active_run"):
            setattr(target, "active_run", lambda: None)  # noqa: B010 - a module attribute mypy cannot see


def _quiet_wandb(module: ModuleType) -> None:
    init = getattr(module, "init", None)
    if init is None or getattr(init, "__flor_quiet__", False):
        return

    def quiet_init(*args: Any, **kwargs: Any) -> Any:
        kwargs["mode"] = "disabled"  # a run object that takes every call and sends nothing
        kwargs.pop("resume", None)
        return init(*args, **kwargs)

    quiet_init.__flor_quiet__ = True  # type: ignore[attr-defined]
    quiet_init.__wrapped__ = init  # type: ignore[attr-defined]  # flor export's own (--flor_export) init
    setattr(module, "init", quiet_init)  # noqa: B010 - a module attribute mypy cannot see


def _quiet_summary_writer(module: ModuleType, folder: Callable[[], Path]) -> None:
    cls = getattr(module, "SummaryWriter", None)
    if cls is None or getattr(cls.__init__, "__flor_quiet__", False):
        return
    original = cls.__init__

    def redirected(self: Any, log_dir: Any = None, *args: Any, **kwargs: Any) -> None:
        where = folder()
        where.mkdir(parents=True, exist_ok=True)  # the replay's own folder, not the script's logdir
        original(self, str(where), *args, **kwargs)

    redirected.__flor_quiet__ = True  # type: ignore[attr-defined]
    cls.__init__ = redirected


class _PatchingLoader(importlib.abc.Loader):
    """A module's own loader, then ``then(module)``."""

    def __init__(self, loader: Any, then: Callable[[ModuleType], None]) -> None:
        self.loader, self.then = loader, then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        try:
            self.then(module)
        except Exception as exc:  # noqa: BLE001 - the script's import must go on; said once
            print(f"flor: FL360 could not quiet {module.__name__} in this replay ({exc}); its calls may "
                  "write to the tracker: guard them with `if not flor.replaying():`", file=sys.stderr)


class TrackerHook(importlib.abc.MetaPathFinder):
    """Quiets a tracker module when the script imports it after flor."""

    def __init__(self, patches: dict[str, Callable[[ModuleType], None]]) -> None:
        self.patches = patches

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        then = self.patches.get(fullname)
        if then is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, then)
                return spec
        return None


def quiet_trackers(folder: Callable[[], Path], run_id: Callable[[], str | None]) -> TrackerHook:
    """Make the script's tracker calls harmless in this replay (see the module docstring).

    Called at ``import flor`` in a replay, before the script's first tracker call; the replay's
    session is asked only when needed: ``folder()`` for where a ``SummaryWriter`` writes,
    ``run_id()`` for the recorded MLflow run a replayed ``start_run()`` answers. Modules already
    imported are quieted now, the others when imported. Returns the import hook (installed)."""
    patches: dict[str, Callable[[ModuleType], None]] = {
        "mlflow": lambda m: _quiet_mlflow(m, run_id),
        "wandb": _quiet_wandb,
        "torch.utils.tensorboard.writer": lambda m: _quiet_summary_writer(m, folder),
    }
    os.environ["WANDB_MODE"] = "disabled"  # wandb.init reads it too: also in processes the script starts
    hook = TrackerHook(patches)
    for name, then in patches.items():
        module = sys.modules.get(name)
        if module is not None:
            then(module)
    sys.meta_path.insert(0, hook)
    return hook


def recorded_mlflow_run(meta: RunMeta) -> str | None:
    """The MLflow run id the recording noted, which a replay's ``mlflow.start_run()`` answers with."""
    note = meta.trackers.get("mlflow") or {}
    return note.get("run_id") if isinstance(note.get("run_id"), str) else None


def export_at_end(store: ExperimentStore, run: str, settings: Settings, pid: int, ngpus: int) -> None:
    """``--flor_export``: the run's values into the trackers, by a replay that covered every epoch
    alone; a worker of several leaves it to ``flor replay --export``, which runs it once after all.
    Never raises: a failed export is a note (FL362), the replay's values are kept."""
    if ngpus != 1:
        print(f"flor: FL361 --flor_export: worker {pid} of {ngpus} does not export (the others may "
              f"not have finished); run `flor export {settings.name} --to "
              f"{','.join(settings.export)}` after the last, or replay with flor replay --export",
              file=sys.stderr)
        return
    from ..export import export_run

    for target in settings.export:
        try:
            print(f"flor: {export_run(store, run, target).line()}", file=sys.stderr)
        except FlorError as exc:
            print(f"flor: FL362 --flor_export {target} failed: {exc}; the replay's values are kept, export them "
                  f"with `flor export {settings.name} --to {target}`", file=sys.stderr)
