"""State a block changes outside the objects given to ``SkipBlock.end``: a step counter, a loss
sum, a history list, a dict of running metrics, a best value, the last batch's loss tensor, and
the same in a function's locals and a global it declares. Used by tests/test_block_vars.py.

A replay that restores a block does not run its body; the code after it must still see these
as a full run does.
"""

import argparse

import torch

import flor

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=6)
args, _ = parser.parse_known_args()

torch.manual_seed(0)
net = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.05)
X, Y = torch.randn(64, 4), torch.randn(64, 1)
step, hist, stats, best = 0, [], {"n": 0, "sum": 0.0}, float("inf")


evals = 0


def evaluate(epoch, seen):
    """A second block, in a function: what it changes are the function's locals, and a module
    global it declares ``global``."""
    global evals
    correct, batches = 0, 0
    if flor.SkipBlock.step_into("eval"):
        with torch.no_grad():
            for i in range(0, 64, 32):
                correct += int(((net(X[i:i + 32]) > 0) == (Y[i:i + 32] > 0)).sum())
                batches += 1
                seen += 32
                evals += 1
    flor.SkipBlock.end(net)
    # HINDSIGHT-FN
    return correct / 64, seen


seen = 0
for epoch in flor.it(range(args.epochs)):
    if flor.SkipBlock.step_into("train"):
        for i in range(0, 64, 16):
            loss = ((net(X[i:i + 16]) - Y[i:i + 16]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            hist.append(loss.item())
            stats["n"] += 1
            stats["sum"] += loss.item()
            if loss.item() < best:
                best = loss.item()
    net, opt = flor.SkipBlock.end(net, opt)
    acc, seen = evaluate(epoch, seen)
    flor.log("acc", acc)
    # HINDSIGHT
