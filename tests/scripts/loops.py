"""The loop people actually write around a SkipBlock, used by tests/test_real_loops.py.

Besides the block (a shuffling DataLoader, dropout, SGD with momentum), the epoch loop keeps
its own state that is NOT given to ``SkipBlock.end``:

* early stopping: ``best_val`` and a patience counter ``bad``; the loop ``break``s
* best-model tracking: the best weights saved with a guarded ``torch.save``
* an EMA of the validation loss, ``ema`` (None before the first epoch)
* a running sample counter, ``samples``
* a hand-written warmup and plateau decay: ``lr`` set each epoch from outer state

The test runs this file as it is (a loop at module level) and wrapped into ``main()`` (the
lines after ``# MAIN`` indented into a function): the same loop, its state in locals.
"""

import argparse

import torch

import flor

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=6)
parser.add_argument("--patience", type=int, default=2)
parser.add_argument("--min_delta", type=float, default=0.0)
parser.add_argument("--save", default="best.pt")
args = parser.parse_args()

# MAIN
torch.manual_seed(0)
X = torch.randn(160, 8)
Y = X @ torch.randn(8, 1) + 0.3 * torch.randn(160, 1)
train = torch.utils.data.TensorDataset(X[:128], Y[:128])
Xv, Yv = X[128:], Y[128:]
loader = torch.utils.data.DataLoader(train, batch_size=16, shuffle=True)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.1), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
base_lr, warmup = 0.05, 2
step = 0

best_val = float("inf")  # early stopping and best-model tracking
bad = 0
ema = None  # EMA of the validation loss
samples = 0  # samples seen so far
lr = 0.0  # set by hand each epoch: warmup, then halved on a plateau

for epoch in flor.it(range(args.epochs)):
    lr = base_lr * (epoch + 1) / warmup if epoch < warmup else (lr * 0.5 if bad else lr)
    for group in optimizer.param_groups:
        group["lr"] = lr
    if flor.SkipBlock.step_into("train"):
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(net(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            # INNER
    net, optimizer, step = flor.SkipBlock.end(net, optimizer, step)
    samples += len(train)
    net.eval()
    with torch.no_grad():
        val = torch.nn.functional.mse_loss(net(Xv), Yv).item()
    net.train()
    ema = val if ema is None else 0.8 * ema + 0.2 * val
    if val < best_val - args.min_delta:
        best_val, bad = val, 0
        if not flor.replaying():  # a side effect a replay must not repeat
            torch.save(net.state_dict(), args.save)
    else:
        bad += 1
    flor.log("val", val)
    flor.log("best_val", best_val)
    flor.log("bad", bad)
    flor.log("ema", ema)
    flor.log("samples", samples)
    flor.log("lr", lr)
    # OUTER
    print(f"epoch {epoch} val {val:.5f} best {best_val:.5f} bad {bad} lr {lr:.4f}")
    if bad >= args.patience:
        break
