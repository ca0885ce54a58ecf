"""Data pipelines that keep random state of their own, used by tests/test_loaders.py.

* ``Stream``: an IterableDataset that shuffles itself with its own ``random.Random``
* ``GenSampler``: a custom Sampler drawing its order from a ``torch.Generator`` it holds
* a DistributedSampler with ``set_epoch`` used without DDP (one replica)
* a DataLoader with two worker processes seeding NumPy from ``torch.initial_seed()``

The loaders sit in a dict, as scripts with several splits keep them. ``--given`` passes the
two generators of the script's own to ``SkipBlock.end``; without it a replay that restores a
block leaves them where they were, and the recording must say so.
"""

import argparse
import random

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import flor

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--given", action="store_true")
args = parser.parse_args()

torch.manual_seed(0)
X = torch.randn(64, 5)
Y = X @ torch.randn(5, 1)
data = TensorDataset(X, Y)


class Stream(IterableDataset):
    def __init__(self, n, seed):
        self.n, self.rng = n, random.Random(seed)

    def __iter__(self):
        order = list(range(self.n))
        self.rng.shuffle(order)
        for i in order:
            yield X[i], Y[i]


class GenSampler(Sampler):
    def __init__(self, n, seed):
        self.n, self.g = n, torch.Generator().manual_seed(seed)

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(torch.randperm(self.n, generator=self.g).tolist())


def seed_worker(worker_id):
    np.random.seed(torch.initial_seed() % 2**32)


stream, sampler = Stream(64, 1), GenSampler(64, 2)
dist = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=3)
loaders = {
    "stream": DataLoader(stream, batch_size=16),
    "sampler": DataLoader(data, batch_size=16, sampler=sampler),
    "dist": DataLoader(data, batch_size=16, sampler=dist),
    "workers": DataLoader(data, batch_size=16, shuffle=True, num_workers=2, worker_init_fn=seed_worker),
}
net = torch.nn.Linear(5, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.05)
step = 0
for epoch in flor.it(range(args.epochs)):
    dist.set_epoch(epoch)
    if flor.SkipBlock.step_into("train"):
        for name, loader in loaders.items():
            for xb, yb in loader:
                loss = ((net(xb) - yb) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                # INNER
    if args.given:
        net, opt, _, _, step = flor.SkipBlock.end(net, opt, sampler.g, stream.rng, step)
    else:
        net, opt, step = flor.SkipBlock.end(net, opt, step)
    flor.log("w", net.weight.sum().item())
