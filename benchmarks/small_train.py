"""Small real models, shaped like the scripts users bring (generated data, no downloads).

--model cnn   the digits CNN (scikit-learn's 8x8 digits, examples/cnn.py's net): Adam, batches
--model vae   pytorch/examples' vae: the 784-400-20 MLP VAE with Adam over batches of 128, a
              train() and a test() function per epoch (data: generated 28x28 binary images)
--model tsp   pytorch/examples' time_sequence_prediction: two LSTMCells(51) and a linear head
              on sine waves, LBFGS with a closure, one optimizer step an epoch, then a
              prediction of the next points under no_grad
--hindsight   an outer-loop hindsight log (the weights' norm), what a user adds later

Instrumented as the README asks: the epoch loop in ``flor.it``, the training in one block whose
``end()`` takes the model and optimizer. Prints LOOP_SECONDS.
"""

import argparse
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import flor

parser = argparse.ArgumentParser()
parser.add_argument("--model", choices=["cnn", "vae", "tsp"], default="cnn")
parser.add_argument("--epochs", type=int, default=6)
parser.add_argument("--hindsight", action="store_true")
args = parser.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1) if args.model == "cnn" else None  # examples/cnn.py trains on one thread


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc21, self.fc22 = nn.Linear(784, 400), nn.Linear(400, 20), nn.Linear(400, 20)
        self.fc3, self.fc4 = nn.Linear(20, 400), nn.Linear(400, 784)

    def forward(self, x):
        h = F.relu(self.fc1(x.view(-1, 784)))
        mu, logvar = self.fc21(h), self.fc22(h)
        z = mu + torch.randn_like(logvar) * torch.exp(0.5 * logvar)
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z)))), mu, logvar


class Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm1, self.lstm2, self.linear = nn.LSTMCell(1, 51), nn.LSTMCell(51, 51), nn.Linear(51, 1)

    def forward(self, x, future=0):
        h = [torch.zeros(x.size(0), 51, dtype=torch.double) for _ in range(4)]
        outputs, out = [], None
        for x_t in x.split(1, dim=1):
            h[0], h[1] = self.lstm1(x_t, (h[0], h[1]))
            h[2], h[3] = self.lstm2(h[0], (h[2], h[3]))
            out = self.linear(h[2])
            outputs.append(out)
        for _ in range(future):
            h[0], h[1] = self.lstm1(out, (h[0], h[1]))
            h[2], h[3] = self.lstm2(h[0], (h[2], h[3]))
            out = self.linear(h[2])
            outputs.append(out)
        return torch.cat(outputs, dim=1)


if args.model == "cnn":
    from sklearn.datasets import load_digits

    digits = load_digits()
    X = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0
    y = torch.tensor(digits.target)
    net = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(0.25), nn.Linear(64 * 16, 128), nn.ReLU(),
                        nn.Linear(128, 10))
    optimizer = torch.optim.AdamW(net.parameters(), lr=3e-3)
elif args.model == "vae":
    g = torch.Generator().manual_seed(1)
    X = (torch.rand(60000, 784, generator=g) < torch.rand(1, 784, generator=g)).float()  # MNIST-sized
    X_test = X[:10000]
    net = VAE()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
else:
    rng = np.random.RandomState(2)
    T, L, N = 20, 100, 40  # pytorch/examples' generate_sine_wave.py (20, 1000, 100), shorter and fewer
    x = np.empty((N, L), "int64")
    x[:] = np.array(range(L)) + rng.randint(-4 * T, 4 * T, N).reshape(N, 1)
    waves = torch.from_numpy(np.sin(x / 1.0 / T).astype("float64"))
    inp, target, test_inp, test_target = waves[3:, :-1], waves[3:, 1:], waves[:3, :-1], waves[:3, 1:]
    net = Sequence().double()
    optimizer = torch.optim.LBFGS(net.parameters(), lr=0.8)


def train_vae(epoch):
    net.train()
    perm = torch.randperm(len(X))
    for i in range(0, len(X), 128):
        batch = X[perm[i:i + 128]]
        optimizer.zero_grad()
        recon, mu, logvar = net(batch)
        bce = F.binary_cross_entropy(recon, batch, reduction="sum")
        kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        (bce + kld).backward()
        optimizer.step()


def test_vae():
    net.eval()
    with torch.no_grad():
        recon, mu, logvar = net(X_test)
        loss = F.binary_cross_entropy(recon, X_test, reduction="sum") - 0.5 * torch.sum(
            1 + logvar - mu.pow(2) - logvar.exp())
    return loss.item() / len(X_test)


def train_cnn():
    net.train()
    perm = torch.randperm(len(X))
    for i in range(0, len(X), 64):
        idx = perm[i:i + 64]
        optimizer.zero_grad()
        F.cross_entropy(net(X[idx]), y[idx]).backward()
        optimizer.step()


def closure():
    optimizer.zero_grad()
    loss = F.mse_loss(net(inp), target)
    loss.backward()
    return loss


t0 = time.perf_counter()
for epoch in flor.it(range(args.epochs)):
    if flor.SkipBlock.step_into("train"):
        if args.model == "vae":
            train_vae(epoch)
        elif args.model == "cnn":
            for _ in range(4):
                train_cnn()
        else:
            optimizer.step(closure)
    net, optimizer = flor.SkipBlock.end(net, optimizer)
    if args.model == "vae":
        flor.log("test_loss", test_vae())
    elif args.model == "cnn":
        net.eval()
        with torch.no_grad():
            flor.log("acc", (net(X).argmax(1) == y).float().mean().item())
    else:
        with torch.no_grad():
            pred = net(test_inp, future=100)
            flor.log("test_loss", F.mse_loss(pred[:, :-100], test_target).item())
    if args.hindsight:
        flor.log("weight_norm", math.sqrt(sum(float(p.double().norm()) ** 2 for p in net.parameters())))
print(f"LOOP_SECONDS {time.perf_counter() - t0:.6f}")
