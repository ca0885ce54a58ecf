"""The script benchmarks/vs_flor.py runs plain, with this flor and with pyflor 2.4.0 (the same API:
flor.it, flor.SkipBlock.step_into/end, flor.log). A ~70 MB MLP checkpoint (weights + Adam state).

--hindsight adds an outer-loop log (the weight norm), what a user adds before a replay.
"""

import argparse
import time

import torch

import flor

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=6)
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--hindsight", action="store_true")
args = parser.parse_args()

torch.manual_seed(0)
H = 1472  # 5.8M parameters: 23 MB of weights, 70 MB with Adam's two moments
net = torch.nn.Sequential(torch.nn.Linear(1024, H), torch.nn.ReLU(), torch.nn.Linear(H, H), torch.nn.ReLU(),
                          torch.nn.Linear(H, H), torch.nn.ReLU(), torch.nn.Linear(H, 10))
optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
data, labels = torch.randn(args.steps * 64, 1024), torch.randint(0, 10, (args.steps * 64,))

t0 = time.perf_counter()
for epoch in flor.it(range(args.epochs)):
    if flor.SkipBlock.step_into("train"):
        for i in range(args.steps):
            loss = torch.nn.functional.cross_entropy(net(data[i * 64:(i + 1) * 64]), labels[i * 64:(i + 1) * 64])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    out = flor.SkipBlock.end(net, optimizer)
    if isinstance(out, tuple):  # this flor returns the (restored) objects; pyflor restores in place
        net, optimizer = out
    if args.hindsight:
        with torch.no_grad():
            flor.log("weight_norm", float(sum(p.double().norm() ** 2 for p in net.parameters()) ** 0.5))
print(f"LOOP_SECONDS {time.perf_counter() - t0:.6f}")
