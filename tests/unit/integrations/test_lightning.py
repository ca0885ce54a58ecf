"""Lightning's FlorCallback in process: inert without flags, and the trainer state it gives
``end()`` (loop progress, the other callbacks' state, the epoch's training-step values) survives
flor's capture and restore into another Trainer (a replay worker's)."""

from __future__ import annotations

from pathlib import Path

import pytest

pl = pytest.importorskip("pytorch_lightning")
torch = pytest.importorskip("torch")

from flor.integrations.lightning import FlorCallback, _CallbackState, _LoopState, _TrainingResults  # noqa: E402
from flor.state import restore, snapshot  # noqa: E402


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch).square().mean()
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        self.log("seen", float(len(batch)), on_step=False, on_epoch=True, reduce_fx="sum")
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.layer(batch).square().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Capture(pl.Callback):
    """Takes what FlorCallback checkpoints, where it does: before the epoch's validation."""

    def __init__(self, own) -> None:
        self.own, self.blobs, self.tree, self.metrics = own, {}, None, None

    def on_validation_start(self, trainer, pl_module):
        if trainer.sanity_checking or trainer.current_epoch != 1:
            return  # epoch 1: the callbacks have a best score from epoch 0's validation
        objs = [_LoopState(trainer), _CallbackState(trainer, self.own), _TrainingResults(trainer)]
        self.tree = snapshot(objs).materialize(lambda data, digest: self.blobs.__setitem__(digest, bytes(data)))
        self.metrics = {k: float(v) for k, v in trainer.fit_loop.epoch_loop._results.metrics(False)["callback"].items()}
        self.best = (float(trainer.early_stopping_callback.best_score), trainer.checkpoint_callback.best_model_path)


def fit(tmp_path, *callbacks, epochs=1):
    data = torch.utils.data.DataLoader(torch.randn(12, 4), batch_size=4)
    trainer = pl.Trainer(max_epochs=epochs, callbacks=[pl.callbacks.EarlyStopping("val_loss", patience=5),
                                                       pl.callbacks.ModelCheckpoint(monitor="val_loss"), *callbacks],
                         default_root_dir=str(tmp_path), logger=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", num_sanity_val_steps=0)
    trainer.fit(Net(), data, data)
    return trainer


def test_inert_without_flags(tmp_path) -> None:
    own = FlorCallback()
    trainer = fit(tmp_path, own)
    assert own.epochs is None and own._taken is None and own._logged is None
    assert trainer.callbacks.index(own) > 0  # not moved first: that happens only in a flor run


def test_trainer_state_survives_capture_and_restore(tmp_path) -> None:
    own = FlorCallback()
    capture = Capture(own)
    fit(tmp_path / "a", own, capture, epochs=2)
    assert set(capture.metrics) == {"train_loss", "train_loss_epoch", "seen"} and capture.metrics["seen"] == 12.0

    fresh = pl.Trainer(max_epochs=2, callbacks=[pl.callbacks.EarlyStopping("val_loss", patience=5),
                                                pl.callbacks.ModelCheckpoint(monitor="val_loss")],
                       logger=False, default_root_dir=str(tmp_path / "b"))
    folder = str(tmp_path / "b" / "checkpoints")
    fresh.checkpoint_callback.dirpath = folder  # as its setup() sets it, before any epoch: another run's folder
    restore([_LoopState(fresh), _CallbackState(fresh, own), _TrainingResults(fresh)], capture.tree,
            capture.blobs.__getitem__)
    loop = fresh.fit_loop.epoch_loop
    assert loop.batch_progress.total.completed == 6 and loop.global_step == 6  # two epochs of 3 batches
    assert fresh.fit_loop.epoch_progress.current.started == 2
    # the epoch-level values of training_step are Lightning's again: reduced as the full run reduces them
    assert {k: float(v) for k, v in loop._results.metrics(False)["callback"].items()} == capture.metrics
    # early stopping and ModelCheckpoint judge this epoch's validation against epoch 0's, as recorded; the
    # recording's paths are kept relative to its folder, so they come back in this run's own
    assert float(fresh.early_stopping_callback.best_score) == capture.best[0]
    assert capture.best[1] == str(tmp_path / "a" / "checkpoints" / "epoch=0-step=3.ckpt")
    assert fresh.checkpoint_callback.best_model_path == str(Path(folder) / "epoch=0-step=3.ckpt")
    assert fresh.checkpoint_callback.dirpath == folder


# -- what the callback says while recording (flor.findings FL601, FL602) ----------------------

class Averaged(Net):
    """Logs a torchmetrics object at epoch level: Lightning reduces it itself, flor cannot rebuild it."""

    def __init__(self) -> None:
        super().__init__()
        self.avg = pytest.importorskip("torchmetrics").MeanMetric()

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.avg.update(loss.detach())
        self.log("avg_loss", self.avg, on_step=False, on_epoch=True)
        return loss


@pytest.mark.parametrize("module, trainer_kw, code, names", [
    (Averaged, {}, "FL601", "avg_loss"),
    (Net, {"val_check_interval": 0.5}, "FL602", "val_check_interval"),
], ids=["FL601-torchmetrics-value", "FL602-mid-epoch-validation"])
def test_recording_names_what_a_replay_cannot_rebuild(tmp_path, monkeypatch, module, trainer_kw, code, names) -> None:
    from flor import hooks

    from helpers import RecordingLoop, said

    loop = RecordingLoop()
    monkeypatch.setattr(hooks, "current", lambda: loop)
    data = torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=4)
    trainer = pl.Trainer(max_epochs=2, callbacks=[FlorCallback()], default_root_dir=str(tmp_path), logger=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                         num_sanity_val_steps=0, enable_checkpointing=False, **trainer_kw)
    with pytest.warns(RuntimeWarning) as caught:
        trainer.fit(module(), data, data)
    lines = [str(w.message) for w in caught if "flor: FL6" in str(w.message)]
    assert len(said("\n".join(lines), code)) == 1 and names in lines[0], lines  # once, though every epoch has it
    assert loop.ends == 2  # and each epoch is checkpointed all the same
