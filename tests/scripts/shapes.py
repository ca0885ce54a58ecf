"""Less common shapes of a script: a SkipBlock outside the loop (memoized preprocessing), a
generator as the epoch iterable, a single object passed to end(), two blocks per epoch, and
values logged before and after the loop. ``--crash-at N`` stops in the middle of epoch N,
prints ``crash point`` and waits there to be killed (SIGKILL), to test what a crash leaves."""

import argparse
import os
import signal
import time

import torch

import flor

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--crash-at", type=int, default=-1)
args = parser.parse_args()

torch.manual_seed(0)
features = torch.zeros(64, 8)
if flor.SkipBlock.step_into("preprocess"):
    features = torch.randn(64, 8).cumsum(0)  # stands for an expensive, randomized preprocessing
features = flor.SkipBlock.end(features)
flor.log("features_sum", features.sum().item())

w = torch.zeros(8, requires_grad=True)
stats = {"seen": 0}


def epochs(n):
    yield from range(n)


for epoch in flor.it(epochs(args.epochs)):
    if flor.SkipBlock.step_into("fit"):
        for i in range(0, 64, 16):
            batch = features[i:i + 16] + 0.1 * torch.randn(16, 8)
            loss = (batch @ w - 1).pow(2).mean()
            loss.backward()
            with torch.no_grad():
                w -= 0.01 * w.grad
                w.grad.zero_()
            stats["seen"] += 16
    w = flor.SkipBlock.end(w)
    if epoch == args.crash_at:
        # the test kills us once the earlier checkpoints are committed (a fixed sleep raced the
        # background writer under load); if nobody does, crash anyway
        print("crash point", flush=True)
        time.sleep(120)
        os.kill(os.getpid(), signal.SIGKILL)
    if flor.SkipBlock.step_into("stats"):
        stats["norm"] = float(w.norm())
    flor.SkipBlock.end(stats)
    flor.log("w_sum", w.sum().item())
    flor.log("seen", stats["seen"])
    # OUTER
flor.log("final_norm", float(w.norm()))
