"""A Trainer whose method holds the epoch loop and keeps its counters on ``self``; only the
model and optimizer are given to ``SkipBlock.end``. Used by tests/test_object_attrs.py.

``self.step``, ``self.best``, ``self.history`` and ``self.meters.seen`` change inside the block
and are read after it: a replay that restores the block must set them as a full run has them.
"""

import argparse
import types

import torch

import flor

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=6)
args, _ = parser.parse_known_args()


class Trainer:
    kind = "plain"  # a class attribute: a plain default, shadowed once set on the instance

    def __init__(self):
        torch.manual_seed(0)
        self.net = torch.nn.Linear(4, 1)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.05)
        self.X, self.Y = torch.randn(64, 4), torch.randn(64, 1)
        self.step, self.best, self.history = 0, float("inf"), []
        self.meters = types.SimpleNamespace(seen=0)

    @property
    def epochs_seen(self):
        return len(self.history)

    def fit(self, epochs):
        for epoch in flor.it(range(epochs)):
            if flor.SkipBlock.step_into("train"):
                for i in range(0, 64, 16):
                    loss = ((self.net(self.X[i:i + 16]) - self.Y[i:i + 16]) ** 2).mean()
                    self.opt.zero_grad()
                    loss.backward()
                    self.opt.step()
                    self.step += 1
                    self.best = min(self.best, loss.item())
                    self.meters.seen += 16
                self.history.append(round(loss.item(), 6))
                self.kind = "trained"
            self.net, self.opt = flor.SkipBlock.end(self.net, self.opt)
            flor.log("w", self.net.weight.sum().item())
            # HINDSIGHT


Trainer().fit(args.epochs)
