"""A small but complete training script used by the integration tests.

Exercises what real scripts do: a shuffling DataLoader, dropout, Adam, a per-batch LR
schedule, a Python step counter, NumPy and Python randomness in the loop, and an outer-loop
evaluation that also draws random numbers. Edits for the tests are made by text substitution
on the marked lines.
"""

import argparse
import random

import numpy as np
import torch

import flor

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=6)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()

torch.manual_seed(args.seed)
np.random.seed(args.seed)
random.seed(args.seed)
X = torch.randn(192, 12)
y = (X[:, :6].sum(1) > X[:, 6:].sum(1)).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=32, shuffle=True)
net = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.Dropout(0.25), torch.nn.ReLU(), torch.nn.Linear(24, 2))
optimizer = torch.optim.Adam(net.parameters(), lr=args.lr)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=args.epochs * len(loader))
step = 0

for epoch in flor.it(range(args.epochs)):
    if flor.SkipBlock.step_into("training_loop"):  # BLOCK
        for xb, yb in loader:
            xb = xb + 0.01 * torch.from_numpy(np.random.randn(*xb.shape).astype("float32"))
            loss = torch.nn.functional.cross_entropy(net(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            # INNER
    net, optimizer, scheduler, step = flor.SkipBlock.end(net, optimizer, scheduler, step)  # END
    net.eval()
    with torch.no_grad():
        acc = (net(X).argmax(1) == y).float().mean().item()
    net.train()
    jitter = random.random()
    flor.log("acc", acc)
    flor.log("jitter", jitter)
    flor.log("step", step)
    # OUTER
    print(f"epoch {epoch} acc {acc:.6f} step {step}")
# AFTER
