"""flor's own threads never start an OpenMP team (issue #13).

A torch operation large enough to run in parallel, run once on a thread that lives on (the
background writer, the replay's prefetch reader), gives that thread its own OpenMP team for
the rest of the run. libgomp then manages more threads than there are cores and, in every
team, stops spinning between parallel regions and sleeps on a futex instead. Measured on
this 2-core machine: the 70 MB MLP of ``benchmarks/vs_flor.py`` trained 1.3-2x slower with
one checkpoint taken, its CPU time unchanged (the spare buffer set's pages were touched with
``torch._foreach_zero_`` on the writer). The training thread's team is the only one.

Seen from inside a real recording and its replay: the threads of the process that are not
Python threads (OpenMP's workers) are the same before the first epoch and after the last
checkpoint was written.
"""

from __future__ import annotations

import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not torch.backends.openmp.is_available(),
                                reason="counts /proc/self/task; torch built without OpenMP has no teams")

SCRIPT = '''
import os, threading, torch, flor

torch.set_num_threads(2)
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.Adam(net.parameters())
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))


def step():
    loss = torch.nn.functional.cross_entropy(net(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def foreign():
    python = {t.native_id for t in threading.enumerate()}
    return sorted(int(t) for t in os.listdir("/proc/self/task") if int(t) not in python)


with torch.no_grad():
    torch.zeros(1 << 20).add_(1)  # the training thread's team exists from here on
before = foreign()
for epoch in flor.it(range(5)):
    if flor.SkipBlock.step_into("train"):
        for _ in range(3):
            loss = step()
    net, opt = flor.SkipBlock.end(net, opt)
    flor.log("weight", float(net[0].weight.sum()))
    writer = getattr(getattr(flor.runtime.current(), "checkpoints", None), "writer", None)  # recording only
    if writer is not None:
        writer.flush()
print("FOREIGN", len(before), len(foreign()), flush=True)
'''


def test_no_openmp_team_on_flors_threads_when_recording_or_replaying(runner):
    script = runner.cwd / "omp_train.py"
    script.write_text(SCRIPT)
    for args in (["--flor", "omp"], ["--flor", "omp", "--replay_flor"]):
        proc = runner.run(script, *args, env=runner.env(OMP_NUM_THREADS="2"))
        line = next(l for l in proc.stdout.splitlines() if l.startswith("FOREIGN"))
        _, before, after = line.split()
        assert int(before) >= 1, f"no OpenMP worker beside the training thread: {line} (the check sees nothing)"
        assert after == before, f"{args}: a flor thread started an OpenMP team ({line})"
