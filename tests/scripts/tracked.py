"""A training script that reports to MLflow and TensorBoard itself, unguarded (and to W&B with
TRACKED_WANDB=1): what a team's script looks like before flor. Its tracker calls are not wrapped
in ``flor.replaying()``: a replay must still create no tracker run and no duplicate point.

MLflow's store is MLFLOW_TRACKING_URI (the tests give a SQLite file or a server). Edits for the
tests are made by text substitution on the marked lines.
"""

import os

import mlflow
import torch
from torch.utils.tensorboard import SummaryWriter

import flor

torch.manual_seed(0)
X = torch.randn(64, 6)
y = (X[:, :3].sum(1) > X[:, 3:].sum(1)).long()
net = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 2))
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
writer = SummaryWriter("tb-logs")  # the script's own logdir
if os.environ.get("TRACKED_WANDB") == "1":
    import wandb

    wandb.init(project="tracked", mode="offline", dir=os.getcwd())

mlflow.set_experiment("tracked")
with mlflow.start_run():
    mlflow.log_param("lr", 0.1)
    for epoch in flor.it(range(4)):
        if flor.SkipBlock.step_into("train"):
            for i in range(0, 64, 16):
                loss = torch.nn.functional.cross_entropy(net(X[i:i + 16]), y[i:i + 16])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        net, optimizer = flor.SkipBlock.end(net, optimizer)
        with torch.no_grad():
            acc = (net(X).argmax(1) == y).float().mean().item()
        flor.log("acc", acc)
        mlflow.log_metric("acc", acc, step=epoch)  # unguarded: a replay must not add a point
        writer.add_scalar("acc", acc, epoch)
        if os.environ.get("TRACKED_WANDB") == "1":
            wandb.log({"acc": acc, "epoch": epoch})
        # OUTER
writer.close()
