"""A block that ends in eval mode, used by tests/test_eval_mode.py: each epoch's block trains
with dropout (``net.train()``) and then validates inside the block (``net.eval()``), so the code
after ``end()`` reads a model in eval mode, as hindsight code that evaluates it does; the
frozen-BatchNorm idiom (``net.bn.eval()`` while the rest trains) keeps one submodule in eval
mode through training."""

import argparse

import torch

import flor

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=6)
args = parser.parse_args()

torch.manual_seed(0)
X = torch.randn(64, 6)
Y = X @ torch.randn(6, 1)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 16)
        self.bn = torch.nn.BatchNorm1d(16)
        self.drop = torch.nn.Dropout(0.5)
        self.out = torch.nn.Linear(16, 1)

    def forward(self, x):
        return self.out(self.drop(torch.relu(self.bn(self.fc(x)))))


def train_mode(net, epoch):
    net.train()
    if epoch >= 3:
        net.bn.eval()  # its running statistics frozen from epoch 3 on


net = Net()
opt = torch.optim.SGD(net.parameters(), lr=0.05)
for epoch in flor.it(range(args.epochs)):
    if flor.SkipBlock.step_into("train"):
        train_mode(net, epoch)
        for b in range(0, 64, 16):
            loss = ((net(X[b:b + 16]) - Y[b:b + 16]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            val = ((net(X) - Y) ** 2).mean().item()
        train_mode(net, epoch)
        if epoch % 2:
            net.eval()  # odd epochs leave the model in eval mode
    net, opt = flor.SkipBlock.end(net, opt)
    flor.log("val", val)
    # HINDSIGHT
