"""A short training run that ends the way a test says (tests/test_exit_status.py).

The marked lines are replaced by an ending: ``sys.exit(3)`` at an epoch (early stopping with
an error code), ``raise SystemExit(1)``, ``exit()``, a health check after the loop, a
``SystemExit`` caught and survived. ``EPOCH_SLEEP`` slows each epoch for a test that kills
the process mid-run.
"""

import os
import sys
import time

import torch

import flor

torch.manual_seed(0)
X = torch.randn(64, 4)
y = X.sum(1, keepdim=True)
net = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(net.parameters(), lr=0.05)

for epoch in flor.it(range(4)):
    if flor.SkipBlock.step_into("train"):
        for i in range(0, 64, 16):
            loss = torch.nn.functional.mse_loss(net(X[i:i + 16]), y[i:i + 16])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    net, optimizer = flor.SkipBlock.end(net, optimizer)
    flor.log("loss", loss.item())
    print(f"epoch {epoch} loss {loss.item():.6f}", flush=True)
    time.sleep(float(os.environ.get("EPOCH_SLEEP", 0)))
    # IN LOOP
# AFTER LOOP
print("done", file=sys.stderr)
