"""Gradient accumulation whose last window may span the end of an epoch (tests/test_loop_hygiene.py).

Seven batches an epoch, the optimizer steps every ``--acc`` of them: with ``--acc 4`` the
last three batches' gradients are left in ``p.grad`` and the next epoch's first backward adds
to them; ``--acc 7`` steps at each epoch's last batch; ``--zero`` zeroes them at the block's
start.
"""

import argparse

import torch

import flor

ap = argparse.ArgumentParser()
ap.add_argument("--acc", type=int, default=4)
ap.add_argument("--zero", action="store_true")
args, _ = ap.parse_known_args()

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
X, y = torch.randn(70, 8), torch.randn(70, 1)

for epoch in flor.it(range(4)):
    if flor.SkipBlock.step_into("train"):
        if args.zero:
            optimizer.zero_grad()
        for i in range(7):
            loss = torch.nn.functional.mse_loss(net(X[i * 10:(i + 1) * 10]), y[i * 10:(i + 1) * 10]) / args.acc
            loss.backward()
            if (i + 1) % args.acc == 0:
                optimizer.step()
                optimizer.zero_grad()
    flor.SkipBlock.end(net, optimizer)
    flor.log("w", float(net[0].weight.sum()))
