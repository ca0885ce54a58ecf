"""A block that calls a function of the script (pytorch/examples' vae and dcgan: ``train(epoch)``),
and an evaluation that samples from torch's global generator as nanoGPT's ``estimate_loss`` does
(tests/e2e/test_hindsight_verdict.py). The script never uses NumPy's or Python's generator and
never seeds them.
"""

import argparse

import torch

import flor

ap = argparse.ArgumentParser()
ap.add_argument("--epochs", type=int, default=4)
args, _ = ap.parse_known_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh(), torch.nn.Linear(4, 8))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.randn(64, 8)


def train(epoch):
    """One epoch of a denoising autoencoder: the noise comes from torch's global generator."""
    total = 0.0
    for i in range(0, 64, 16):
        x = data[i:i + 16]
        loss = ((model(x + 0.1 * torch.randn_like(x)) - x) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item()
        # IN-TRAIN
    return total


def estimate_loss():
    """Held-out loss on a fresh random batch, as nanoGPT's estimate_loss draws its batches."""
    with torch.no_grad():
        x = torch.randn(16, 8)
        return float(((model(x) - x) ** 2).mean())


for epoch in flor.it(range(args.epochs)):
    if flor.SkipBlock.step_into("train"):
        train(epoch)
    model, optimizer = flor.SkipBlock.end(model, optimizer)
    # OUTER
