"""The last batch's loss, assigned inside the block and logged after ``SkipBlock.end``, which
is not given it. Used by tests/test_block_bindings.py.

A replay that restores the block skips it: ``loss`` keeps what it had before (a whole replay
stops with a NameError at epoch 0; a worker starting mid-run logs one value, restored with the
loop's state, for every epoch); the recording must say so, and how to pass it.
"""

import torch

import flor

torch.manual_seed(0)
X = torch.randn(64, 4)
Y = X @ torch.randn(4, 1)
net = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.05)
# BEFORE LOOP
for epoch in flor.it(range(6)):
    if flor.SkipBlock.step_into("train"):
        for xb, yb in zip(X.split(16), Y.split(16)):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(net(xb), yb)
            loss.backward()
            opt.step()
    net, opt = flor.SkipBlock.end(net, opt)
    flor.log("w", net.weight.sum().item())
    # HINDSIGHT
