"""A model with BatchNorm whose running statistics change wherever a forward pass runs in
training mode, used by tests/test_outside_changes.py. With ``--outer-forward`` the script's own
code runs such a pass after each block (a recorded in-place change the replay makes too)."""

import argparse

import torch

import flor

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--outer-forward", action="store_true")
args = parser.parse_args()

torch.manual_seed(0)
X = torch.randn(64, 6)
Y = X @ torch.randn(6, 1)
net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(net.parameters(), lr=0.05)
for epoch in flor.it(range(args.epochs)):
    if flor.SkipBlock.step_into("train"):
        for b in range(0, 64, 16):
            loss = ((net(X[b:b + 16]) - Y[b:b + 16]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    net, opt = flor.SkipBlock.end(net, opt)
    if args.outer_forward:
        with torch.no_grad():
            net(X)  # in training mode: BatchNorm's running statistics move
    flor.log("mean", net[1].running_mean.sum().item())
    # HINDSIGHT
