"""A small Lightning fit with FlorCallback: synthetic data, a tiny MLP, SGD with an
epoch-interval StepLR, ModelCheckpoint and EarlyStopping on the validation loss, a training
loss logged per step and per epoch. The hindsight edits of the tests add lines at the marks."""

import json
import os
import sys

import torch
from pytorch_lightning import Callback, LightningModule, Trainer, seed_everything
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from flor.integrations.lightning import FlorCallback

EPOCHS = int(os.environ.get("EPOCHS", "4"))
WIDTH = int(os.environ.get("WIDTH", "16"))


class Net(LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, WIDTH), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                       torch.nn.Linear(WIDTH, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        # TRAINING
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", torch.nn.functional.cross_entropy(logits, y))
        # VALIDATION

    def on_validation_epoch_end(self):
        self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        # EPOCH END

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)}


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, (x[:, 0] + x[:, 1] > 0).long())


class Printer(Callback):
    """Prints each epoch's values as flor keeps them: what a run without flor gives a test to compare."""

    def on_train_epoch_end(self, trainer, pl_module):
        m = trainer.callback_metrics
        kept = {k: float(v) for k, v in m.items()
                if not k.endswith("_step") and not (k.endswith("_epoch") and k[:-6] in m)}
        print("VALUES", json.dumps({"epoch": trainer.current_epoch, "values": kept}))


import time  # noqa: E402

seed_everything(0, verbose=False)
train = DataLoader(data(int(os.environ.get("SAMPLES", "256")), 1), batch_size=32, shuffle=True)
val = DataLoader(data(64, 2), batch_size=32)
trainer = Trainer(max_epochs=EPOCHS, callbacks=[ModelCheckpoint(monitor="val_loss"), EarlyStopping("val_loss"),
                                                FlorCallback(), Printer()],
                  accelerator="cpu", devices=1, enable_progress_bar=False, enable_model_summary=False,
                  default_root_dir=os.getcwd(), num_sanity_val_steps=2)
started = time.perf_counter()
trainer.fit(Net(), train, val)
print("fitted", trainer.current_epoch, trainer.global_step, file=sys.stderr)
print(f"FIT_SECONDS {time.perf_counter() - started:.4f}", file=sys.stderr)  # benchmarks/frameworks.py
