"""A training script the way people write it: tqdm bars over the epochs and the batches,
argparse, AdamW with a cosine schedule, and prints. Edits for the tests are text substitutions
on the marked lines."""

import argparse

import torch
from tqdm import tqdm

import flor

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=8)
args = parser.parse_args()

torch.manual_seed(0)
X = torch.randn(256, 8)
y = (X[:, :4].sum(1) > X[:, 4:].sum(1)).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=16, shuffle=True)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
optimizer = torch.optim.AdamW(net.parameters(), lr=0.01)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)

for epoch in tqdm(flor.it(range(args.epochs)), desc="epochs"):
    if flor.SkipBlock.step_into("training_loop"):  # BLOCK
        for xb, yb in tqdm(loader, desc=f"epoch {epoch}", mininterval=0):
            loss = torch.nn.functional.cross_entropy(net(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            # INNER
        scheduler.step()
    net, optimizer, scheduler = flor.SkipBlock.end(net, optimizer, scheduler)  # END
    with torch.no_grad():
        acc = (net(X).argmax(1) == y).float().mean().item()
    flor.log("acc", acc)
    # OUTER
    print(f"epoch {epoch} acc {acc:.6f}")
