"""Hindsight logging for the Hugging Face Trainer: ``Trainer(..., callbacks=[FlorCallback()])``.

Run the script as always with ``--flor NAME`` to record and ``--replay_flor [PID/N]`` (or
``flor replay NAME --workers N -- python train.py``) to replay; without flor's flags the
callback does nothing at all. Made for ``eval_strategy="epoch"``. See docs/transformers.md.

Where it hooks in, read from transformers 5's ``Trainer._inner_training_loop``, which calls
``_run_epoch`` once an epoch; that ends with ``on_epoch_end`` and then
``_maybe_log_save_evaluate`` (the epoch's training log, evaluation, checkpoint):

- At ``on_init_end`` the callback finds its Trainer (no hook is given it) and takes over the
  Trainer's ``_run_epoch`` for the epochs flor drives; it moves itself first among the callbacks.
- The checkpoint of an epoch is taken at ``on_epoch_end``, after its training steps and before
  its evaluation: the model, the optimizer, the LR scheduler, the ``TrainerState`` (global step,
  log history, best metric), the other callbacks' exported state, the random generators, and
  what the training log is built from that lives in the inner loop (the accumulated loss, the
  last step's grad norm and learning rate, the step last logged, the FLOs).
- A replay runs no training step of a restored epoch (no callback can skip a batch): its
  ``_run_epoch`` calls ``on_epoch_end`` (the restore: ``global_step``, the per-step scheduler and
  the loss accumulators come back as the full run had them) and then
  ``_maybe_log_save_evaluate`` with the recorded grad norm and learning rate, so the epoch's
  training log, ``compute_metrics`` and early stopping give what a full run gives.
- What the Trainer logs in an epoch (``trainer.log``: the training loss, the evaluation metrics)
  becomes flor values of that epoch at its global step; timings (``*_runtime``,
  ``*_per_second``) are not, since they differ from run to run.
- A replay writes nothing of the Trainer's own: no checkpoint folders, and the reporting
  callbacks (TensorBoard, W&B, MLflow, ...) are removed.
"""

from __future__ import annotations

import dataclasses
import sys
from types import FrameType
from typing import Any

from ..hooks import Epochs

try:
    from transformers import Trainer, TrainerCallback
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("flor.integrations.transformers needs transformers: pip install -e '.[transformers]'") from exc

__all__ = ["FlorCallback"]

_TIMINGS = ("_runtime", "_per_second")


def _find_trainer(callback: Any) -> Any:
    """The Trainer whose callbacks hold ``callback``: a frame of the call that runs the hook."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, Trainer) and callback in getattr(owner.callback_handler, "callbacks", ()):
            return owner
        frame = frame.f_back
    return None


class _StateOf:
    """The ``TrainerState``, the exported state of the other callbacks (early stopping's patience)
    and the inner loop's training-log accumulators, as one stateful object."""

    def __init__(self, trainer: Any, own: Any, recorded: set[str] | None = None) -> None:
        self.trainer, self.own = trainer, own
        # replaying: the names the recording logged. The log history of an executed epoch holds the
        # values added in hindsight (a compute_metrics entry), which are no state of the recording's
        self.recorded = recorded

    def _exportable(self) -> dict[str, Any]:
        return {type(cb).__name__: cb for cb in self.trainer.callback_handler.callbacks
                if cb is not self.own and callable(getattr(cb, "state", None))}

    def state_dict(self) -> dict[str, Any]:
        t, state = self.trainer, self.trainer.state
        fields = {f.name: getattr(state, f.name) for f in dataclasses.fields(state) if f.name != "stateful_callbacks"}
        # the history without its timings (they differ from run to run: an executed epoch's would never
        # match the recording's) nor, replaying, the values added in hindsight
        fields["log_history"] = [{k: v for k, v in entry.items() if not k.endswith(_TIMINGS)
                                  and (self.recorded is None or not self._hindsight(k, v))}
                                 for entry in state.log_history]
        return {
            "state": fields,
            "callbacks": {name: dict(cb.state().get("attributes", {})) for name, cb in self._exportable().items()},
            "tr_loss": t._tr_loss.detach().clone(), "total_loss": float(t._total_loss_scalar),
            "last_logged": int(t._globalstep_last_logged), "flos": float(t.current_flos),
            "grad_norm": self.own.grad_norm, "learning_rate": self.own.learning_rate,
        }

    def _hindsight(self, name: str, value: Any) -> bool:
        """A value of the log history that on_log gives flor and the recording did not log (the
        history adds ``step`` to what on_log is given)."""
        assert self.recorded is not None
        return name != "step" and _kept(name, value) and name not in self.recorded

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        t = self.trainer
        for name, value in saved["state"].items():
            setattr(t.state, name, value)
        for name, cb in self._exportable().items():
            for attr, value in saved["callbacks"].get(name, {}).items():
                setattr(cb, attr, value)
        t._tr_loss = saved["tr_loss"].clone().to(t._tr_loss.device)
        t._total_loss_scalar, t._globalstep_last_logged = saved["total_loss"], saved["last_logged"]
        t.current_flos = saved["flos"]
        self.own.grad_norm, self.own.learning_rate = saved["grad_norm"], saved["learning_rate"]


class FlorCallback(TrainerCallback):
    """Record a Hugging Face Trainer run with flor and replay it with hindsight logging.

    ``probed=True``: a replay re-executes each epoch's training steps (from the previous
    checkpoint) instead of restoring them, for values added in the training step; each executed
    epoch is checked against the recording.
    """

    def __init__(self, *, probed: bool = False) -> None:
        self.probed = probed
        self.epochs: Epochs | None = None
        self.trainer: Any = None
        self.grad_norm: Any = None  # the last step's, as the inner loop hands it to the epoch's training log
        self.learning_rate: Any = None
        self._in_epoch = False

    # -- setting up ------------------------------------------------------------------------

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        epochs = Epochs()
        if epochs.mode == "inert":
            return
        trainer = _find_trainer(self)
        if trainer is None:
            raise RuntimeError("flor's FlorCallback could not find its Trainer: give it in Trainer(callbacks=[...])")
        self.epochs, self.trainer = epochs, trainer
        handler = trainer.callback_handler
        others = [cb for cb in handler.callbacks if cb is not self]
        if epochs.mode == "replay":  # a replay reports to no tracker and writes no checkpoint folder
            others = [cb for cb in others if not type(cb).__module__.startswith("transformers.integrations")]
            trainer._save_checkpoint = lambda *a, **k: None
        handler.callbacks = [self, *others]  # a new list: the hook being called iterates the old one
        strategy = str(getattr(args.eval_strategy, "value", args.eval_strategy))
        if strategy != "epoch" and epochs.session is not None:
            epochs.session.warn_once("FL603", strategy, (
                f"the Trainer evaluates with eval_strategy={strategy!r}: flor checkpoints each epoch at its end, so a "
                "replay that restores an epoch runs no evaluation inside it; use eval_strategy='epoch'"))
        run_epoch = trainer._run_epoch

        def driven(*a: Any, **kw: Any) -> None:
            self._run_epoch(run_epoch, *a, **kw)

        trainer._run_epoch = driven

    # -- each epoch ------------------------------------------------------------------------

    def _run_epoch(self, run_epoch: Any, *a: Any, **kw: Any) -> None:
        epochs, trainer = self.epochs, self.trainer
        assert epochs is not None
        epoch = kw["epoch"]
        if not epochs.begin(epoch):
            if epoch >= epochs.first():  # past this worker's epochs
                trainer.control.should_training_stop = True
            return  # before them: a worker that starts mid-run restores its first epoch's state
        self._in_epoch = True
        try:
            if epochs.train(self.probed):
                run_epoch(*a, **kw)
            else:  # the restore is in on_epoch_end; the epoch's log, evaluation and save as a full run
                trainer.control = trainer.callback_handler.on_epoch_end(trainer.args, trainer.state, trainer.control)
                trainer._maybe_log_save_evaluate(trainer._tr_loss, self.grad_norm, kw["model"], kw["trial"], epoch,
                                                 kw["ignore_keys_for_eval"], kw["start_time"],
                                                 learning_rate=self.learning_rate)
        finally:
            self._in_epoch = False
        session = epochs.session
        plan = getattr(session, "plan", None)
        if plan is not None and epoch + 1 >= plan.stop:
            trainer.control.should_training_stop = True  # this worker's last epoch

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        epochs = self.epochs
        if epochs is None or not epochs.open:
            return
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_code.co_name != "_run_epoch":
            frame = frame.f_back
        if frame is not None:  # the epoch ran: its last step's grad norm and learning rate are its locals
            self.grad_norm = _plain(frame.f_locals.get("grad_norm"))
            self.learning_rate = _plain(frame.f_locals.get("learning_rate"))
        trainer = self.trainer
        epochs.checkpoint(trainer.model, trainer.optimizer, trainer.lr_scheduler,
                          _StateOf(trainer, self, epochs.recorded_names()))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.epochs is not None:
            self.epochs.finish()

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if self.epochs is None or not self._in_epoch or not logs:
            return
        for name, value in logs.items():
            if _kept(name, value):
                self.epochs.log(name, value, step=state.global_step)


def _kept(name: str, value: Any) -> bool:
    """A value of the Trainer's logs that flor keeps: a number, not the epoch nor a timing."""
    return name != "epoch" and not name.endswith(_TIMINGS) and isinstance(value, (int, float))


def _plain(value: Any) -> Any:
    """A grad norm or learning rate as a float (a 0-d tensor's value), None as None."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
