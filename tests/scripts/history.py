"""A history of batch losses appended inside the block and read after it, the list not given
to ``SkipBlock.end``. Used by tests/test_forgotten_container.py.

A list of numbers is noted at the block's end and set again where a replay restores the block.
With ``--tensors`` it holds 1-element tensors, which are not plain data: a replay that restores
the block leaves it empty, so a hindsight ``len(losses)`` logs 0 where the full run logs 1, 2,
3; the recording must say so.
"""

import sys

import torch

import flor

torch.manual_seed(0)
net = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
X, Y = torch.randn(32, 4), torch.randn(32, 1)
losses = []
for epoch in flor.it(range(3)):
    if flor.SkipBlock.step_into("train"):
        loss = ((net(X) - Y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach().reshape(1) if "--tensors" in sys.argv else loss.item())
    net, opt = flor.SkipBlock.end(net, opt)
    flor.log("w", net.weight.sum().item())
    # HINDSIGHT
