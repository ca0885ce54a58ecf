"""
Train a small convolutional net on scikit-learn's 8x8 handwritten digits.

Written the way training scripts usually are -- top to bottom, no framework --
and instrumented with flor. Every line flor adds ends in `# flor`. With no
flor flags flor is inert and this is a plain PyTorch script.

    python examples/cnn.py                                   # plain training
    python examples/cnn.py --flor cnn-demo                   # record
    python examples/cnn.py --flor cnn-demo --replay_flor     # replay, after adding logs

examples/README.md walks through adding hindsight logs to this script.
"""

import argparse
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset

import flor  # flor

# -----------------------------------------------------------------------------
# settings (flor takes its own --flor/--replay_flor flags out of sys.argv at
# import, so argparse only ever sees these)
parser = argparse.ArgumentParser(description="Small CNN on 8x8 digits, instrumented with flor.")
# 8 passes over 1,437 training images reach ~97% validation accuracy; more
# mostly fits noise.
parser.add_argument("--epochs", type=int, default=8)
# Peak learning rate of the one-cycle schedule. AdamW on a net this size is
# stable well above this; 3e-3 converges in few epochs without spikes.
parser.add_argument("--lr", type=float, default=3e-3)
# Small batches: the dataset is tiny, so more optimizer steps per epoch matter
# more than throughput.
parser.add_argument("--batch-size", type=int, default=64)
# AdamW's decoupled decay, torch's default strength; it matters little here
# but is what a real run would have.
parser.add_argument("--weight-decay", type=float, default=1e-2)
# The fully connected head has ~65k weights for ~1.4k images: dropout keeps it
# from memorizing the training set.
parser.add_argument("--dropout", type=float, default=0.25)
# Seeds weight init, shuffling and dropout. The train/val split does not depend
# on it, so runs with different seeds are scored on the same images.
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()

# -----------------------------------------------------------------------------
# reproducibility
# flor's replay restores the objects passed to SkipBlock.end() and the global
# random generators (Python, NumPy, torch). So every random draw in this
# script -- weight init, shuffling, dropout -- comes from those generators;
# the DataLoader loads in this process (worker processes would draw from
# their own generators); and nothing depends on the clock.
random.seed(args.seed)
np.random.seed(args.seed)
torch.manual_seed(args.seed)
# Fail loudly if an op without a deterministic implementation sneaks in,
# rather than have replay diverge from the recording by a few ulps.
torch.use_deterministic_algorithms(True)
# One CPU thread. Ops on a net this small are too little work to split: one
# thread is as fast, does not slow to a crawl when other jobs share the cores
# (two replay workers side by side, say), and makes results independent of
# the core count -- kernels split work per thread, so different thread counts
# can differ in the last bits, and replay would no longer match bit for bit.
torch.set_num_threads(1)

# -----------------------------------------------------------------------------
# data: 1,797 grayscale 8x8 digits bundled with scikit-learn (no download)
digits = load_digits()
X = digits.images.astype(np.float32)[:, None, :, :]  # (N, 1, 8, 8): one input channel
y = digits.target.astype(np.int64)
# A fixed, stratified 80/20 split: every class appears in validation in the
# same proportion as in training.
X_train, X_val, y_train, y_val = train_test_split(X, y, test_size=0.2, random_state=0, stratify=y)
# One mean and std over all training pixels (not per pixel): a convolution
# slides the same filter over every position, so every position should be on
# the same scale.
mean, std = X_train.mean(), X_train.std()
X_train = (X_train - mean) / std
X_val = (X_val - mean) / std

train_ds = TensorDataset(torch.from_numpy(X_train), torch.from_numpy(y_train))
val_ds = TensorDataset(torch.from_numpy(X_val), torch.from_numpy(y_val))
# shuffle=True with no generator= draws the permutation from torch's global
# generator, which flor checkpoints; num_workers=0 keeps loading in-process.
trainloader = DataLoader(train_ds, batch_size=args.batch_size, shuffle=True, num_workers=0)
# Evaluation order does not matter, and a large batch makes it one or two calls.
valloader = DataLoader(val_ds, batch_size=512, shuffle=False, num_workers=0)


# -----------------------------------------------------------------------------
# model
class Net(nn.Module):
    def __init__(self, dropout: float):
        super().__init__()
        # padding=1 keeps the 8x8 size: on images this small the border pixels
        # carry strokes, and unpadded 3x3 convs would drop a third of them.
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 128)  # after one 2x2 max-pool: 32 channels of 4x4
        self.fc2 = nn.Linear(128, 10)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = self.dropout(torch.flatten(x, 1))
        x = self.dropout(F.relu(self.fc1(x)))
        return self.fc2(x)


net = Net(args.dropout)
# AdamW: adaptive steps make the LR less sensitive than SGD's, and decoupled
# weight decay does not fight the adaptive scaling.
optimizer = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=args.weight_decay)
# One-cycle: warm up then anneal, defined per optimizer step, so it is stepped
# once per batch. It holds state (its step count) that replay must restore,
# which is why it goes through SkipBlock.end() below.
scheduler = torch.optim.lr_scheduler.OneCycleLR(
    optimizer, max_lr=args.lr, total_steps=args.epochs * len(trainloader))


@torch.no_grad()
def evaluate(net, loader):
    """Mean cross-entropy and accuracy over a loader. Leaves the net in eval mode."""
    net.eval()  # dropout off
    total_loss, correct = 0.0, 0
    for images, labels in loader:
        logits = net(images)
        total_loss += F.cross_entropy(logits, labels, reduction="sum").item()
        correct += (logits.argmax(dim=1) == labels).sum().item()
    n = len(loader.dataset)
    return total_loss / n, correct / n


# -----------------------------------------------------------------------------
# training
step = 0  # optimizer steps so far: the x-axis for anything logged per batch
for epoch in flor.it(range(args.epochs)):  # flor
    if flor.SkipBlock.step_into("training_loop"):  # flor
        net.train()  # evaluate() left the net in eval mode; turn dropout back on
        for images, labels in trainloader:
            loss = F.cross_entropy(net(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
    # Everything the block changes goes through end(): replay restores it when
    # it skips the block. step is an int, so it is rebound from the result.
    net, optimizer, scheduler, step = flor.SkipBlock.end(net, optimizer, scheduler, step)  # flor
    flor.log("weight_norm", nn.utils.parameters_to_vector(net.parameters()).norm().item())  # flor (hindsight)
    val_loss, val_acc = evaluate(net, valloader)
    flor.log("val_loss", val_loss)  # flor
    flor.log("val_acc", val_acc)  # flor
    print(f"epoch {epoch} val_loss {val_loss:.4f} val_acc {val_acc:.4f}")
