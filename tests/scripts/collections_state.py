"""State kept in ``collections`` containers and NumPy arrays outside ``SkipBlock.end``, used by
tests/test_collections_state.py: the block counts batches in a ``Counter``, sums per-batch
figures into a NumPy array in place and appends to a ``defaultdict(list)``; the epoch loop keeps
a ``deque`` of recent validation losses and an ``OrderedDict`` of the best epoch. None of them
is given to ``end()``."""

import argparse
import collections

import numpy as np
import torch

import flor

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=6)
args = parser.parse_args()

torch.manual_seed(0)
X = torch.randn(32, 4)
Y = X @ torch.randn(4, 1)
net = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.05)
recent = collections.deque(maxlen=3)
seen = collections.Counter()
acc = np.zeros(3, dtype=np.float32)
per_batch = collections.defaultdict(list)
best = collections.OrderedDict(epoch=-1, loss=float("inf"))
for epoch in flor.it(range(args.epochs)):
    if flor.SkipBlock.step_into("train"):
        for b in range(0, 32, 8):
            loss = ((net(X[b:b + 8]) - Y[b:b + 8]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen["batches"] += 1
            acc += np.array([loss.item(), 1.0, b], dtype=np.float32)
            per_batch["loss"].append(round(loss.item(), 6))
    net, opt = flor.SkipBlock.end(net, opt)
    val = ((net(X) - Y) ** 2).mean().item()
    recent.append(val)
    if val < best["loss"]:
        best["epoch"], best["loss"] = epoch, val
    flor.log("recent", sum(recent) / len(recent))
    # HINDSIGHT
