"""An epoch loop with flor.it wrapped in another iterator, used by tests/test_loop_wrappers.py:
``enumerate`` counts the epochs, and the count picks the learning rate of a schedule."""

import argparse

import torch

import flor

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
args = parser.parse_args()

torch.manual_seed(0)
X = torch.randn(32, 4)
Y = X @ torch.randn(4, 1)
net = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
schedule = [0.1, 0.05, 0.02, 0.01, 0.005, 0.002]
for i, epoch in enumerate(flor.it(range(args.epochs))):  # LOOP
    lr = schedule[i]
    for group in opt.param_groups:
        group["lr"] = lr
    if flor.SkipBlock.step_into("train"):
        for b in range(0, 32, 8):
            loss = ((net(X[b:b + 8]) - Y[b:b + 8]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    net, opt = flor.SkipBlock.end(net, opt)
    flor.log("w", net.weight.sum().item())
    # HINDSIGHT
