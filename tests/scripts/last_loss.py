"""The last batch's loss and output, assigned inside the block and read after ``SkipBlock.end``,
which is given neither. Used by tests/test_block_bindings.py.

``loss`` is a number (a 0-d tensor): the recording notes it and a replay that restores the block
sets it. ``out`` is a batch of outputs, which is not noted: a replay that restores the block
skips it, so ``out`` keeps what it had before (a whole replay stops with a NameError at epoch
0; a worker starting mid-run logs one stale value for every epoch); the recording must say so,
and how to pass it.
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
            out = net(xb)
            loss = torch.nn.functional.mse_loss(out, yb)
            loss.backward()
            opt.step()
    net, opt = flor.SkipBlock.end(net, opt)
    flor.log("w", net.weight.sum().item())
    # HINDSIGHT
