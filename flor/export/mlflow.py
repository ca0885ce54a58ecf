"""Export to MLflow: metrics through ``MlflowClient.log_batch`` into the run the recording reported to.

The tracking URI is the one given (``--tracking-uri``), else the one the recording noted, else
MLflow's own (``MLFLOW_TRACKING_URI``, then its default). The run is the one the script had active
while recording; when it had none, a run of the MLflow experiment named like flor's, tagged
``flor.experiment`` and ``flor.run`` (found again by those tags on the next export). A point
already in the run's metric history at its (key, step) is not logged again.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import ConfigError, StorageError
from ..store import ExperimentStore
from ..store.runmeta import RunMeta
from . import ExportResult, missing
from .points import Point

__all__ = ["BATCH", "export_mlflow", "tracking_uri"]

#: metrics one ``log_batch`` call takes (MLflow's limit)
BATCH = 1000


def tracking_uri(meta: RunMeta, given: str | None = None) -> str | None:
    """Where the run's MLflow store is: ``given``, the recorded URI, ``MLFLOW_TRACKING_URI``; None: MLflow's default."""
    note = meta.trackers.get("mlflow") or {}
    recorded = note.get("tracking_uri") if isinstance(note.get("tracking_uri"), str) else None
    return given or recorded or os.environ.get("MLFLOW_TRACKING_URI") or None


def export_mlflow(store: ExperimentStore, meta: RunMeta, points: list[Point], *, dry_run: bool = False,
                  tracking_uri: str | None = None) -> ExportResult:
    try:
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        raise missing("mlflow", "mlflow") from exc
    uri = _resolve(meta, tracking_uri)
    try:
        client = MlflowClient(tracking_uri=uri)
        return _export(client, store, meta, points, dry_run=dry_run, uri=uri or "MLflow's default store")
    except MlflowException as exc:
        raise StorageError(f"MLflow at {uri or 'its default tracking URI'} refused the export of run {meta.run}: "
                           f"{exc.message if hasattr(exc, 'message') else exc}; check the tracking URI "
                           "(--tracking-uri or MLFLOW_TRACKING_URI) and that the run exists") from exc


def _resolve(meta: RunMeta, given: str | None) -> str | None:
    return tracking_uri(meta, given)


def _export(client: Any, store: ExperimentStore, meta: RunMeta, points: list[Point], *, dry_run: bool,
            uri: str) -> ExportResult:
    from mlflow.entities import Metric

    note = meta.trackers.get("mlflow") or {}
    run_id = note.get("run_id") if isinstance(note.get("run_id"), str) else None
    created = False
    if run_id is not None:
        try:
            client.get_run(run_id)
        except Exception as exc:
            raise ConfigError(f"the MLflow run {run_id} that run {meta.run} recorded is not in {uri} ({exc}); "
                              "pass the store it is in with --tracking-uri") from exc
    else:
        run_id = _tagged_run(client, meta)
        if run_id is None:
            created = True
            if not dry_run:
                experiment = client.get_experiment_by_name(meta.name)
                experiment_id = experiment.experiment_id if experiment is not None else \
                    client.create_experiment(meta.name)
                run_id = client.create_run(experiment_id, tags=_tags(meta), run_name=f"flor {meta.run}").info.run_id
    present = {(key, m.step) for key in dict.fromkeys(p.key for p in points) if run_id is not None
               for m in client.get_metric_history(run_id, key)}
    result = ExportResult("mlflow", meta.run, f"run {run_id or '(new)'} at {uri}", dry_run=dry_run,
                          created=created).take(points, present)
    if dry_run or run_id is None:
        return result
    for key, value in _tags(meta).items():  # the run says which flor run it holds
        client.set_tag(run_id, key, value)
    metrics = [Metric(p.key, p.value, int(p.t * 1000), p.step) for p in result.written]
    for i in range(0, len(metrics), BATCH):
        client.log_batch(run_id, metrics=metrics[i:i + BATCH])
    return result


def _tags(meta: RunMeta) -> dict[str, str]:
    return {"flor.experiment": meta.name, "flor.run": meta.run}


def _tagged_run(client: Any, meta: RunMeta) -> str | None:
    """The run an earlier export made for this flor run (the script had no MLflow run), if any."""
    experiment = client.get_experiment_by_name(meta.name)
    if experiment is None:
        return None
    found = client.search_runs([experiment.experiment_id],
                               filter_string=f"tags.`flor.run` = '{meta.run}'", max_results=1)
    return found[0].info.run_id if found else None
