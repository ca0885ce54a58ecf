"""A small script whose SkipBlock state holds plain leaves flor encodes natively (a dataclass with
a set and a path, an enum, a timedelta, a numpy Generator) and one it can only pickle (a
Counter). Used by tests/test_security_state.py."""

import collections
import dataclasses
import datetime
import enum
import pathlib

import numpy as np
import torch

import flor


class Mode(enum.Enum):
    TRAIN = 1
    EVAL = 2


@dataclasses.dataclass
class Stats:
    best: float = -1e9
    seen: set = dataclasses.field(default_factory=set)
    where: pathlib.Path = pathlib.Path("runs")


torch.manual_seed(0)
X, y = torch.randn(32, 4), torch.randint(0, 2, (32,))
net = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
gen = np.random.default_rng(0)
counts = collections.Counter()  # no plain form: pickled, and the manifest signed
stats, step, mode, when = Stats(), 0, Mode.TRAIN, datetime.timedelta(0)
for epoch in flor.it(range(3)):
    if flor.SkipBlock.step_into("train"):
        for i in range(4):
            loss = torch.nn.functional.cross_entropy(net(X + float(gen.normal())), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            counts[f"e{epoch}"] += 1
        stats.best = max(stats.best, -loss.item())
        stats.seen.add(epoch)
        mode, when = Mode.EVAL, datetime.timedelta(seconds=step)
    net, opt, gen, counts, stats, step, mode, when = flor.SkipBlock.end(
        net, opt, gen, counts, stats, step, mode, when)
    flor.log("step", step)
    flor.log("count", sum(counts.values()))
    flor.log("best", stats.best)
    flor.log("seen", len(stats.seen))
    flor.log("mode", mode.name)
    flor.log("when", when.total_seconds())
    flor.log("w", net.weight.sum().item())
