"""
flor's "hello world": softmax regression on handwritten digits.

Lines that end in `# flor` are the ones flor adds to a plain PyTorch script.
With no flor flags flor is inert and this is an ordinary training run.

    python examples/linear.py                                # plain training
    python examples/linear.py --flor linear-demo             # record
    python examples/linear.py --flor linear-demo --replay_flor   # replay

Data: scikit-learn's bundled 8x8 digits (no download), or real MNIST when
--data-dir points at a folder holding the four MNIST idx files.
"""

import argparse
import gzip
import os
import random

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset

import flor  # flor

parser = argparse.ArgumentParser(description="Softmax regression on digits, instrumented with flor.")
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--data-dir", default=None,
                    help="folder with the four MNIST idx files (gzipped or not); default: sklearn's 8x8 digits")
args = parser.parse_args()

# Replay restores the global random generators along with the objects given to
# end(), so every random draw here (init, shuffling) goes through them.
random.seed(args.seed)
np.random.seed(args.seed)
torch.manual_seed(args.seed)
# A model this small gains nothing from more threads, and a fixed count keeps
# results bit-identical across machines (kernels split work per thread).
torch.set_num_threads(1)


def read_idx(data_dir: str, name: str) -> np.ndarray:
    """Read one MNIST idx file (uint8 payload), gzipped or not, with numpy."""
    for path in (os.path.join(data_dir, name), os.path.join(data_dir, name + ".gz")):
        if os.path.exists(path):
            break
    else:
        raise FileNotFoundError(f"neither {name} nor {name}.gz in {data_dir!r}")
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        raw = f.read()
    # Header: two zero bytes, a type code (0x08 = uint8), the number of
    # dimensions, then one big-endian uint32 per dimension.
    if raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path}: not a uint8 idx file (header bytes {raw[:4].hex()})")
    ndim = raw[3]
    shape = tuple(np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


if args.data_dir:
    X_train = read_idx(args.data_dir, "train-images-idx3-ubyte").reshape(-1, 28 * 28).astype(np.float32)
    y_train = read_idx(args.data_dir, "train-labels-idx1-ubyte").astype(np.int64)
    X_val = read_idx(args.data_dir, "t10k-images-idx3-ubyte").reshape(-1, 28 * 28).astype(np.float32)
    y_val = read_idx(args.data_dir, "t10k-labels-idx1-ubyte").astype(np.int64)
else:
    digits = load_digits()
    # The split is fixed (random_state=0, not --seed) so runs with different
    # seeds are scored on the same images.
    X_train, X_val, y_train, y_val = train_test_split(
        digits.data.astype(np.float32), digits.target.astype(np.int64),
        test_size=0.2, random_state=0, stratify=digits.target)

# Standardize each pixel with training statistics; border pixels that are
# always 0 have std 0 and are left at 0 rather than divided by zero.
mean = X_train.mean(axis=0)
std = X_train.std(axis=0)
std[std == 0] = 1.0
X_train = (X_train - mean) / std
X_val = (X_val - mean) / std

trainloader = DataLoader(TensorDataset(torch.from_numpy(X_train), torch.from_numpy(y_train)),
                         batch_size=args.batch_size, shuffle=True, num_workers=0)
valloader = DataLoader(TensorDataset(torch.from_numpy(X_val), torch.from_numpy(y_val)),
                       batch_size=1024, shuffle=False, num_workers=0)

net = torch.nn.Linear(X_train.shape[1], 10)
optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)


@torch.no_grad()
def evaluate(net, loader):
    correct = 0
    for x, y in loader:
        correct += (net(x).argmax(dim=1) == y).sum().item()
    return correct / len(loader.dataset)


train_loss = 0.0  # mean training loss of the last epoch
for epoch in flor.it(range(args.epochs)):  # flor
    if flor.SkipBlock.step_into("training_loop"):  # flor
        total, batches = 0.0, 0
        for x, y in trainloader:
            loss = F.cross_entropy(net(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
            batches += 1
        train_loss = total / batches
    # train_loss goes through end() too: when replay skips the block, it comes
    # back from the checkpoint instead of being recomputed.
    net, optimizer, train_loss = flor.SkipBlock.end(net, optimizer, train_loss)  # flor
    val_acc = evaluate(net, valloader)
    flor.log("loss", train_loss)  # flor
    flor.log("val_acc", val_acc)  # flor
    print(f"epoch {epoch} loss {train_loss:.4f} val_acc {val_acc:.4f}")
