"""State kept in ``collections`` containers, used by tests/test_collections_state.py: a
``deque`` of recent validation losses the epoch loop appends to, and a ``Counter`` the block
counts batches in. Neither is given to ``SkipBlock.end``."""

import argparse
import collections

import torch

import flor

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
args = parser.parse_args()

torch.manual_seed(0)
X = torch.randn(32, 4)
Y = X @ torch.randn(4, 1)
net = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.05)
recent = collections.deque(maxlen=3)
seen = collections.Counter()
for epoch in flor.it(range(args.epochs)):
    if flor.SkipBlock.step_into("train"):
        for b in range(0, 32, 8):
            loss = ((net(X[b:b + 8]) - Y[b:b + 8]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen["batches"] += 1
    net, opt = flor.SkipBlock.end(net, opt)
    recent.append(((net(X) - Y) ** 2).mean().item())
    flor.log("recent", sum(recent) / len(recent))
