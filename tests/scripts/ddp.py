"""A DDP training script (gloo, CPU) for the distributed-recording tests.

Recorded with ``torchrun --nproc-per-node 2 ddp.py --flor NAME`` (every rank gets --flor);
replayed with ``flor replay NAME -- python ddp.py`` (each worker a world of one) or plainly
with ``python ddp.py --flor NAME --replay_flor`` (no torchrun: no process group at all).
``stats`` is rank-dependent state, like BatchNorm statistics without SyncBatchNorm: the
recording must notice it differs between ranks.
"""

import argparse
import gc
import os
import random

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import flor

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
args = parser.parse_args()

if "RANK" in os.environ:  # under torchrun (or flor replay's world of one)
    dist.init_process_group("gloo")
rank = dist.get_rank() if dist.is_initialized() else 0
world = dist.get_world_size() if dist.is_initialized() else 1

torch.manual_seed(0)
np.random.seed(0)
random.seed(0)
X = torch.randn(256, 12)
y = (X[:, :6].sum(1) > X[:, 6:].sum(1)).long()
data = TensorDataset(X, y)
sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=32, sampler=sampler)
net = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.ReLU(), torch.nn.Linear(24, 2))
model = DistributedDataParallel(net) if dist.is_initialized() else net
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
stats = {"last_batch_sum": 0.0}  # differs by rank: each rank sees its own shard
step = 0

for epoch in flor.it(range(args.epochs)):
    sampler.set_epoch(epoch)
    if flor.SkipBlock.step_into("training_loop"):
        for xb, yb in loader:
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            stats["last_batch_sum"] = float(xb.sum())
            step += 1
    net, optimizer, step, stats = flor.SkipBlock.end(net, optimizer, step, stats)
    with torch.no_grad():
        acc = (net(X).argmax(1) == y).float().mean().item()
    flor.log("acc", acc)
    flor.log("rank", rank)
    # OUTER
    print(f"rank {rank} epoch {epoch} acc {acc:.6f} step {step}")

if dist.is_initialized():
    # the DDP wrapper holds the process group: left for the interpreter's exit, torch 2.13's
    # gloo threads abort a rank now and then ("terminate called without an active exception",
    # one run in ten under load, with or without flor), so it goes first
    del model
    gc.collect()  # DDP's reducer sits in a reference cycle
    dist.destroy_process_group()
