"""Every value flor holds for a run, recorded and hindsight, put where the team looks: MLflow, W&B
or TensorBoard (``flor export NAME --to mlflow``; docs/export.md).

Each exporter writes the run's points (``flor.export.points``: key, value, step) into the run
the recording reported to (run.json's ``trackers``, noted by ``flor.engine.trackers``) and
skips every point the tracker already holds at the same (key, step), so exporting twice adds
nothing. A tracker's client is imported only by its exporter; a missing one is a ``ConfigError``
naming the extra to install. Tracker errors are translated here into ``FlorError``, once.

>>> TARGETS
('mlflow', 'tensorboard', 'wandb')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..settings import EXPORT_TARGETS as TARGETS
from ..settings import parse_export
from ..store import ExperimentStore
from ..store.experiment import open_experiment
from ..store.runmeta import RunMeta
from .points import Point, points_of

__all__ = ["EXPLICIT", "ExportResult", "TARGETS", "export", "export_run", "parse_targets", "trusted_destination"]

@dataclass
class ExportResult:
    """What one export of one run did (or, with ``dry_run``, would do)."""

    target: str
    run: str
    where: str  # the tracker's run or folder, as its user names it
    written: list[Point] = field(default_factory=list)  # new points (with dry_run: the ones that would be)
    present: int = 0  # points the tracker already held at their (key, step): not written again
    collapsed: int = 0  # flor values that share a (key, step) with another one: not exported
    dry_run: bool = False
    created: bool = False  # a tracker run was made for it (the script reported to none)

    def take(self, points: list[Point], present: set[tuple[str, int]]) -> ExportResult:
        """Sort ``points`` into those to write and those the tracker holds (``present``: its (key, step))."""
        for p in points:
            if (p.key, p.step) in present:
                self.present += 1
            else:
                self.written.append(p)
        return self

    def line(self) -> str:
        hindsight = sum(p.hindsight for p in self.written)
        verb = "would write" if self.dry_run else "wrote"
        text = (f"{self.target}: run {self.run} -> {self.where}: {verb} {len(self.written)} value(s) "
                f"({hindsight} hindsight), {self.present} already there")
        if self.collapsed:
            text += f", {self.collapsed} sharing a (key, step) with another left out"
        return text + (" (new tracker run, tagged flor.experiment and flor.run)" if self.created else "")


def parse_targets(text: str, origin: str = "--to") -> tuple[str, ...]:
    """``mlflow,tensorboard`` -> the targets; a ConfigError names an unknown one.

    >>> parse_targets("mlflow, wandb")
    ('mlflow', 'wandb')
    """
    targets = parse_export(text, origin)
    if not targets:
        raise ConfigError(f"{origin}: name a tracker: one of {', '.join(TARGETS)} (several joined by commas)")
    return targets


#: the option that names a target's destination instead of the recorded one
EXPLICIT = {"mlflow": "tracking_uri", "tensorboard": "logdir"}


def trusted_destination(meta: RunMeta, target: str, options: dict[str, Any], *, trust: bool = False,
                        config_dir: Path | None = None) -> None:
    """A ``ConfigError`` where the export would write into a destination read from the store (run.json's
    ``trackers``: a tracking URI, a logdir, a W&B run) that no key the user trusts signed: a planted
    run.json must not send a run's values to someone else's server, or files into someone else's
    folder. Passes where the user names the destination (``--tracking-uri``, ``--logdir``) or
    ``trust`` (``--trust``, after checking it with ``flor show``)."""
    if trust or target not in meta.trackers or options.get(EXPLICIT.get(target, "")):
        return
    from ..settings import SETTINGS
    from ..store.trust import verify_trackers

    why = verify_trackers(meta.trackers_signature, meta.trackers, config_dir or SETTINGS.config_dir)
    if why is not None:
        name = {"mlflow": "--tracking-uri URI", "tensorboard": "--logdir DIR"}.get(target)
        raise ConfigError(f"run {meta.run} names where to export to {target}, but {why}: check it "
                          f"(`flor show {meta.name} --run {meta.run}` prints it), then pass --trust"
                          + (f", or name it yourself with {name}" if name else ""))


def export_run(store: ExperimentStore, run: str, target: str, *, dry_run: bool = False, prefix: str = "",
               options: dict[str, Any] | None = None, trust: bool = False,
               config_dir: Path | None = None) -> ExportResult:
    """Export one run's points to ``target``; ``options``: ``tracking_uri`` (MLflow), ``logdir``
    (TensorBoard), ``mode`` (W&B). A destination recorded in the store is used only when signed
    by a key the user trusts, or with ``trust`` (``trusted_destination``)."""
    options = options or {}
    meta = store.read_run(run)
    trusted_destination(meta, target, options, trust=trust, config_dir=config_dir)
    points, collapsed = points_of(store, run, prefix=prefix)
    if target == "mlflow":
        from .mlflow import export_mlflow

        result = export_mlflow(store, meta, points, dry_run=dry_run, tracking_uri=options.get("tracking_uri"))
    elif target == "tensorboard":
        from .tensorboard import export_tensorboard

        result = export_tensorboard(meta, points, dry_run=dry_run, logdir=options.get("logdir"))
    elif target == "wandb":
        from .wandb import export_wandb

        result = export_wandb(store, meta, points, dry_run=dry_run, mode=options.get("mode"))
    else:
        parse_targets(target)
        raise AssertionError(target)  # pragma: no cover - parse_targets raised
    result.collapsed = collapsed
    return result


def export(name: str | None, to: str, *, run: str | None = None, home: Path | None = None, dry_run: bool = False,
           prefix: str = "", trust: bool = False, config_dir: Path | None = None,
           **options: Any) -> list[ExportResult]:
    """Export runs of experiment ``name`` (default the latest; ``run="all"``: every run) to the
    trackers ``to`` names (``"mlflow"``, ``"wandb,tensorboard"``).

    >>> export("no-such-experiment", "mlflow", home=Path("/nonexistent"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    flor.errors.ReplayError: ...
    """
    targets = parse_targets(to)
    store = open_experiment(name, home)
    return [export_run(store, r, t, dry_run=dry_run, prefix=prefix, options=options, trust=trust,
                       config_dir=config_dir) for r in store.select_runs(run) for t in targets]


def missing(extra: str, module: str) -> ConfigError:
    """The error for a tracker client that is not installed."""
    return ConfigError(f"exporting to {extra} needs the {module} package: pip install -e '.[{extra}]' "
                       f"(or pip install {module})")
