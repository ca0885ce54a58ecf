"""A model whose head grows in the epoch loop at epoch 2, its optimizer re-created there. Used
by tests/test_grown_model.py.

A replay worker that starts at epoch 4 does not run epoch 2's loop code: its model still has the
small head, and the checkpoint does not fit it. ``--flor_strong`` runs that code (every earlier
epoch as an initialization epoch); the failure must say so.
"""

import torch

import flor

torch.manual_seed(0)
X = torch.randn(64, 6)
Y = torch.randint(0, 4, (64,))
net = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 2))
opt = torch.optim.Adam(net.parameters(), lr=0.01)
for epoch in flor.it(range(6)):
    classes = 2 if epoch < 2 else 4
    if epoch == 2:  # the task grows: a wider head, a new optimizer
        net[2] = torch.nn.Linear(10, 4)
        opt = torch.optim.Adam(net.parameters(), lr=0.005)
    if flor.SkipBlock.step_into("train"):
        for xb, yb in zip(X.split(16), (Y % classes).split(16)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(xb), yb).backward()
            opt.step()
    net, opt = flor.SkipBlock.end(net, opt)
    flor.log("acc", (net(X).argmax(1) == Y % classes).float().mean().item())
    # HINDSIGHT
