"""ReduceLROnPlateau stepped on the validation loss after the block, and not given to
``SkipBlock.end`` (the recording warns about it). Used by tests/test_forgotten_scheduler.py.

The validation losses are fixed, with a plateau from epoch 2 on, so the scheduler halves the
learning rate after epoch 5 in a full run; a replay worker starting at epoch 4 has a scheduler
that saw no plateau, and its learning rate is not the full run's.
"""

import torch

import flor

torch.manual_seed(0)
X, Y = torch.randn(64, 4), torch.randn(64, 1)
net = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.5)
sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=3)
losses = [1.0, 0.9, 0.95, 0.96, 0.97, 0.98]
for epoch in flor.it(range(6)):
    if flor.SkipBlock.step_into("train"):
        loss = ((net(X) - Y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    net, opt = flor.SkipBlock.end(net, opt)
    sched.step(losses[epoch])
    flor.log("val", losses[epoch])
    # HINDSIGHT
