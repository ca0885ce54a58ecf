"""Hindsight logging for PyTorch Lightning: ``Trainer(..., callbacks=[FlorCallback()])``.

Run the script as always with ``--flor NAME`` to record and ``--replay_flor [PID/N]`` (or
``flor replay NAME --workers N -- python train.py``) to replay; without flor's flags the
callback does nothing at all. See docs/lightning.md.

Where it hooks in, read from Lightning 2.6's fit loop (``FitLoop``, ``_TrainingEpochLoop``):

- The checkpoint of epoch ``e`` is taken once its training batches are done and before its
  validation runs: at ``on_validation_start`` of the end-of-epoch validation, which the training
  epoch loop runs inside its last ``on_advance_end``, after the step- and epoch-interval LR
  schedulers stepped; at ``on_train_epoch_end`` in an epoch without validation. It holds the
  LightningModule, the optimizers, the LR schedulers, the loops' progress (epoch, global step,
  batches), the other callbacks' ``state_dict``, the epoch-level values ``training_step`` logged
  so far (they are built from the steps a replay skips), the precision plugin and the random
  generators.
- A replay skips a restored epoch's training batches by giving the training epoch loop one
  ``advance`` that runs no batch and marks the epoch's last batch reached (a callback's return
  value cannot skip batches, and the module's ``on_train_batch_start`` returning -1 also skips
  that epoch's validation). The loop then validates as a full run does, and the restore happens
  at the same hook the checkpoint was taken in, so validation, ``on_*_epoch_end``, plateau
  schedulers, ``ModelCheckpoint`` and early stopping see the recorded state.
- The values in ``trainer.callback_metrics`` at the end of each epoch (``self.log`` at epoch
  level: validation, ``on_epoch=True``) become flor values of that epoch; the sanity check's
  validation runs before the first epoch and is not an epoch's value. Step-level values of
  ``training_step`` (what Lightning hands its loggers at each step) are kept by global step.
- A replay writes nothing of the Trainer's own: its loggers are dropped and checkpoint files
  are not written (``ModelCheckpoint`` still tracks its best model as the full run did).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..hooks import Epochs

__all__ = ["FlorCallback"]


def _bases() -> tuple[type, ...]:
    """Lightning's ``Callback`` of each namespace installed (``lightning.pytorch``,
    ``pytorch_lightning``): the Trainer of either accepts the callback."""
    found: list[type] = []
    try:
        from lightning.pytorch import Callback as _Unified

        found.append(_Unified)
    except ImportError:
        pass
    try:
        from pytorch_lightning import Callback as _Classic

        if _Classic not in found:
            found.append(_Classic)
    except ImportError:
        pass
    if not found:
        raise ImportError("flor.integrations.lightning needs PyTorch Lightning: pip install -e '.[lightning]' "
                          "(or pip install lightning)")
    return tuple(found)


_REDUCE = {"mean": torch.mean, "sum": torch.sum, "max": torch.max, "min": torch.min}


class _LoopState:
    """The fit loop's progress (epoch, global step, batches, validation runs) as one stateful object."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def _parts(self) -> dict[str, Any]:
        fit = self.trainer.fit_loop
        epoch_loop = fit.epoch_loop
        return {
            "epoch": fit.epoch_progress,
            "batch": epoch_loop.batch_progress,
            "scheduler": epoch_loop.scheduler_progress,
            "optim": epoch_loop.automatic_optimization.optim_progress,
            "manual": epoch_loop.manual_optimization.optim_step_progress,
            "val_batch": epoch_loop.val_loop.batch_progress,
        }

    def state_dict(self) -> dict[str, Any]:
        state = {name: part.state_dict() for name, part in self._parts().items()}
        state["batches_that_stepped"] = int(self.trainer.fit_loop.epoch_loop._batches_that_stepped)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, part in self._parts().items():
            if name in state:
                part.load_state_dict(state[name])
        self.trainer.fit_loop.epoch_loop._batches_that_stepped = int(state["batches_that_stepped"])


class _CallbackState:
    """The ``state_dict`` of every other callback (``ModelCheckpoint``'s best scores, early
    stopping's patience), keyed by ``state_key``."""

    def __init__(self, trainer: Any, own: Any) -> None:
        self.trainer, self.own = trainer, own

    def _callbacks(self) -> dict[str, Any]:
        return {cb.state_key: cb for cb in self.trainer.callbacks if cb is not self.own}

    def state_dict(self) -> dict[str, Any]:
        out = {}
        for key, cb in self._callbacks().items():
            state = cb.state_dict()
            folder = getattr(cb, "dirpath", None)
            # ModelCheckpoint's folder is the logger's version folder, another one in each run: its paths are
            # kept relative to it, so an epoch a replay executes before any restore matches the recording's
            out[key] = _moved(state, folder, _FOLDER) if isinstance(folder, str) and folder else state
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, cb in self._callbacks().items():
            if key in state and state[key]:
                recorded = state[key]
                folder = getattr(cb, "dirpath", None)
                if recorded.get("dirpath") == _FOLDER and isinstance(folder, str) and folder:
                    recorded = _moved(recorded, _FOLDER, folder)  # the recording's paths, in this run's folder
                elif "dirpath" in recorded and hasattr(cb, "dirpath"):
                    cb.dirpath = recorded["dirpath"]  # ModelCheckpoint keeps its best scores only for its own folder
                cb.load_state_dict(recorded)


_FOLDER = "<ModelCheckpoint.dirpath>"  # stands for the callback's own folder in the paths it keeps


def _moved(value: Any, old: str, new: str) -> Any:
    """``value`` with each path under the folder ``old`` (a string, a dict's key or value) under ``new``."""
    if isinstance(value, str):
        if value == old:
            return new
        return new + value[len(old):] if value.startswith(old) and value[len(old):len(old) + 1] in ("/", "\\") \
            else value
    if isinstance(value, dict):
        return {_moved(k, old, new): _moved(v, old, new) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_moved(v, old, new) for v in value)
    return value


class _TrainingResults:
    """The epoch-level values ``training_step`` logged so far in the epoch (``self.log(...,
    on_epoch=True)``): the accumulators Lightning reduces at the epoch's end. Tensor values with a
    mean, sum, max or min reduction are kept; others (torchmetrics objects, custom reductions)
    are not, and the callback names them."""

    def __init__(self, trainer: Any, recorded: set[str] | None = None) -> None:
        self.trainer = trainer
        # replaying: the names the recording logged. A value added in hindsight is no state of the
        # recording's, so an executed epoch's check against it leaves it out
        self.recorded = recorded
        self.unkept: set[str] = set()
        self.created: set[str] = set()  # entries the restore made: the next epoch's own self.log makes them anew

    def _results(self) -> Any:
        return self.trainer.fit_loop.epoch_loop._results

    def state_dict(self) -> dict[str, Any]:
        kept: dict[str, Any] = {}
        for key, metric in self._results().items():
            meta = metric.meta
            reduce = next((n for n, fx in _REDUCE.items() if meta.reduce_fx is fx), None)
            if not meta.on_epoch or self.recorded is not None and meta.name not in self.recorded:
                continue
            if not metric.is_tensor or reduce is None:
                self.unkept.add(meta.name)
                continue
            kept[key] = {
                "fx": meta.fx, "name": meta.name, "prog_bar": meta.prog_bar, "logger": meta.logger,
                "on_step": meta.on_step, "reduce": reduce, "add_dataloader_idx": meta.add_dataloader_idx,
                "value": metric.value.detach().clone(), "has_reset": metric.has_reset,
                "count": metric.cumulated_batch_size.detach().clone() if meta.is_mean_reduction else None,
            }
        return kept

    def forget_created(self) -> None:
        """Drop the entries the restore made, before an epoch whose steps run: ``self.log`` refuses an
        entry whose settings differ from its own (the sync function a restore cannot know)."""
        results = self._results()
        for key in self.created:
            results.pop(key, None)
        self.created.clear()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from importlib import import_module

        results = self._results()
        module = import_module(type(results).__module__)  # the namespace the Trainer runs in
        for key, kept in state.items():
            if key not in results:
                meta = module._Metadata(fx=kept["fx"], name=kept["name"], prog_bar=kept["prog_bar"],
                                        logger=kept["logger"], on_step=kept["on_step"], on_epoch=True,
                                        reduce_fx=_REDUCE[kept["reduce"]],
                                        add_dataloader_idx=kept["add_dataloader_idx"])
                meta.sync = module._Sync()
                results[key] = module._ResultMetric(meta, True)
                self.created.add(key)
            metric = results[key]
            metric.value = kept["value"].clone()
            if kept["count"] is not None:
                metric.cumulated_batch_size = kept["count"].clone()
            metric.has_reset = bool(kept["has_reset"])
            metric._update_count = max(1, int(getattr(metric, "_update_count", 0)))  # updated, as by the steps
            if getattr(metric, "_forward_cache", None) is None:
                metric._forward_cache = metric.value.clone()


class _WriteNothing:
    """A replay's checkpoint IO: ``ModelCheckpoint`` decides and tracks as in the full run, but
    the recording's checkpoint files are neither written again nor removed."""

    def save_checkpoint(self, checkpoint: Any, path: Any, storage_options: Any = None) -> None:
        pass

    def remove_checkpoint(self, path: Any) -> None:
        pass

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: Any = None) -> Any:
        raise FileNotFoundError(f"{path}: a flor replay loads its state from flor's checkpoints")

    def teardown(self) -> None:
        pass


class FlorCallback(*_bases()):  # type: ignore[misc]
    """Record a Lightning fit with flor and replay it with hindsight logging.

    ``probed=True``: a replay re-executes each epoch's training (from the previous checkpoint)
    instead of restoring it, for values added in ``training_step``; each executed epoch is
    checked against the recording.

    Put it in ``callbacks=[...]``; it moves itself first, so the other callbacks' hooks see the
    restored state in a replay.
    """

    def __init__(self, *, probed: bool = False) -> None:
        super().__init__()
        self.probed = probed
        self.epochs: Epochs | None = None
        self._skipping = False
        self._taken: int | None = None  # the epoch whose checkpoint was taken (or restored)
        self._logged: int | None = None  # the epoch whose values went to flor
        self._results: _TrainingResults | None = None

    @property
    def state_key(self) -> str:
        return "FlorCallback"

    # -- setting up ------------------------------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        epochs = Epochs()
        if epochs.mode == "inert":
            return
        self.epochs = epochs
        callbacks = trainer.callbacks
        if callbacks and callbacks[0] is not self and self in callbacks:
            callbacks.remove(self)
            callbacks.insert(0, self)  # the other callbacks' hooks run after the restore
        if epochs.mode == "replay":
            trainer.loggers = []  # a replay writes into no logger folder (flor keeps its values)
            trainer.strategy.checkpoint_io = _WriteNothing()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.epochs is None or self.epochs.mode != "replay":
            return
        first = self.epochs.first()
        session = self.epochs.session
        plan = getattr(session, "plan", None)
        if plan is not None:  # this worker's epochs end where its segment does
            trainer.fit_loop.max_epochs = max(plan.stop, first)
        progress = trainer.fit_loop.epoch_progress
        if first > progress.current.completed:  # a worker that starts mid-run: at its newest checkpoint
            for tracker in (progress.current, progress.total):
                tracker.ready = tracker.started = tracker.processed = tracker.completed = first

    # -- each epoch ------------------------------------------------------------------------

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if self.epochs is None:
            return
        self._log_epoch(trainer)
        if self._results is not None:
            self._results.forget_created()
        epoch = trainer.current_epoch
        if not self.epochs.begin(epoch):
            trainer.should_stop = True
            return
        if not self.epochs.train(self.probed):
            self._skip_batches(trainer)

    def _skip_batches(self, trainer: Any) -> None:
        """This epoch's training batches do not run: its one ``advance`` marks the last batch
        reached, as the full run's last batch does, so validation runs where it ran."""
        loop = trainer.fit_loop.epoch_loop
        self._skipping = True

        def advance(data_fetcher: Any) -> None:
            progress = loop.batch_progress
            batches = trainer.num_training_batches
            n = int(batches) if math.isfinite(batches) else 1
            for tracker in (progress.current, progress.total):
                tracker.ready += n
                tracker.started += n
                tracker.processed += n
                tracker.completed += n - 1  # the last batch completes after validation, as in a full run
            progress.is_last_batch = True
            del loop.advance  # the class's own advance again, for the next epoch

        loop.advance = advance

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """The step-level values ``training_step`` logged (as Lightning hands them to its loggers),
        by global step: a recording's, and a probed replay's (a restored epoch runs no step)."""
        if self.epochs is None or self.epochs.epoch is None:
            return
        results = trainer.fit_loop.epoch_loop._results
        step = trainer.global_step
        for name, value in sorted(results.metrics(True)["log"].items()):
            self.epochs.log(name, value, step=step)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self.epochs is None or trainer.sanity_checking:
            return  # the sanity check's validation runs before the first epoch: not an epoch's
        if trainer.state.fn != "fit":
            return
        if not trainer.fit_loop.epoch_loop._num_ready_batches_reached():  # not the epoch's end: val_check_interval
            if self.epochs.session is not None:
                self.epochs.session.warn_once("FL602", "val_check_interval", (
                    "validation runs in the middle of epochs (val_check_interval): flor checkpoints each epoch at "
                    "its end, so a replay that restores an epoch does not run its mid-epoch validations; validate "
                    "once an epoch, or replay with FlorCallback(probed=True)"))
            return
        self._checkpoint(trainer, pl_module)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.epochs is not None:
            self._checkpoint(trainer, pl_module)  # an epoch without validation

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.epochs is None:
            return
        self._log_epoch(trainer)
        self.epochs.finish()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.epochs is not None:
            self.epochs.abandon()

    # -- checkpoint and values ---------------------------------------------------------------

    def _checkpoint(self, trainer: Any, pl_module: Any) -> None:
        epochs = self.epochs
        assert epochs is not None
        epoch = trainer.current_epoch
        if self._taken == epoch or not epochs.open:
            return
        self._taken = epoch
        if self._skipping and hasattr(trainer.fit_loop.epoch_loop, "__dict__"):
            trainer.fit_loop.epoch_loop.__dict__.pop("advance", None)
        self._skipping = False
        if self._results is None:
            self._results = _TrainingResults(trainer, epochs.recorded_names())
        schedulers = [config.scheduler for config in trainer.lr_scheduler_configs]
        epochs.checkpoint(pl_module, *trainer.optimizers, *schedulers, _LoopState(trainer),
                          _CallbackState(trainer, self), self._results, trainer.precision_plugin)
        if self._results.unkept and epochs.session is not None:
            names = ", ".join(sorted(self._results.unkept))
            epochs.session.warn_once("FL601", names, (
                f"the epoch-level values {names} logged in training_step are not tensors with a mean, sum, max or "
                "min reduction: a replay that restores an epoch cannot rebuild them, and they are logged as "
                "the replay computes them (from no steps)"))

    def _log_epoch(self, trainer: Any) -> None:
        """The epoch's values (``trainer.callback_metrics`` once its validation and epoch-end
        hooks ran) into flor, as values of that epoch; step-level entries (``*_step``) are not."""
        epochs = self.epochs
        if epochs is None or epochs.epoch is None or self._logged == epochs.epoch:
            return
        self._logged = epochs.epoch
        metrics = trainer.callback_metrics
        for name, value in sorted(metrics.items()):
            if name.endswith("_step") or name.endswith("_epoch") and name[: -len("_epoch")] in metrics:
                continue  # a value logged on_step and on_epoch: its epoch value is also under its own name
            epochs.log(name, value)
