"""A training class, the way many scripts organize training: one ``Trainer`` holds the model, the
optimizer, the scheduler, a DataLoader and a step counter as attributes, and the whole object is
given to ``SkipBlock.end(trainer)``. Used by tests/test_trainer_object.py.

A DataLoader refuses any assignment to ``dataset``, ``batch_size``, ``sampler``... once built,
even of the same object; restoring the trainer in place must not assign them. With
``--loader_workers 2`` the loader keeps persistent worker processes, and its live iterator (a
generator object inside) between epochs: not state, and not to be captured.
"""

import argparse

import torch

import flor


class Trainer:
    def __init__(self, epochs: int, loader_workers: int) -> None:
        torch.manual_seed(0)
        X = torch.randn(96, 6)
        Y = X @ torch.randn(6, 1) + 0.1 * torch.randn(96, 1)
        self.Xv, self.Yv = X[64:], Y[64:]
        self.loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X[:64], Y[:64]), batch_size=16,
                                                  shuffle=True, num_workers=loader_workers,
                                                  persistent_workers=loader_workers > 0)
        self.model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Dropout(0.1), torch.nn.Tanh(),
                                         torch.nn.Linear(8, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=2, gamma=0.5)
        self.epochs = epochs
        self.step = 0
        self.losses = []

    def train_epoch(self) -> None:
        for xb, yb in self.loader:
            loss = torch.nn.functional.mse_loss(self.model(xb), yb)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            self.step += 1
        self.losses.append(loss.item())
        self.sched.step()

    def fit(self) -> None:
        for epoch in flor.it(range(self.epochs)):
            if flor.SkipBlock.step_into("train"):
                self.train_epoch()
            flor.SkipBlock.end(self)
            with torch.no_grad():
                val = torch.nn.functional.mse_loss(self.model(self.Xv), self.Yv).item()
            flor.log("val", val)
            # HINDSIGHT


parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--loader_workers", type=int, default=0)
args = parser.parse_args()
Trainer(args.epochs, args.loader_workers).fit()
