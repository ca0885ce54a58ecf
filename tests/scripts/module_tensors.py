"""A module whose state is partly outside its state_dict: a non-persistent buffer counting the
samples seen, another holding an EMA of the inputs, a tensor attribute set in forward, and a
layer under the legacy ``torch.nn.utils.weight_norm``, which sets ``weight`` as a plain tensor
attribute in a forward pre-hook, and one under the legacy ``spectral_norm``, whose ``weight``
shares its parameter's memory until the first forward. Used by tests/test_module_tensors.py.
"""

import warnings

import torch

import flor

warnings.filterwarnings("ignore", category=FutureWarning)  # the legacy weight_norm is deprecated
torch.manual_seed(0)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = torch.nn.utils.spectral_norm(torch.nn.Linear(6, 8))
        self.out = torch.nn.utils.weight_norm(torch.nn.Linear(8, 2))
        self.register_buffer("seen", torch.zeros((), dtype=torch.long), persistent=False)
        self.register_buffer("mean_in", torch.zeros(6), persistent=False)
        self.last_mean = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.seen += x.shape[0]
            self.mean_in.mul_(0.9).add_(0.1 * x.mean(0))
        y = self.out(torch.tanh(self.hidden(x)))
        self.last_mean = y.detach().mean()
        return y


X = torch.randn(64, 6)
Y = (X.sum(1) > 0).long()
net = Net()
opt = torch.optim.Adam(net.parameters(), lr=0.01)
for epoch in flor.it(range(6)):
    if flor.SkipBlock.step_into("train"):
        for i in range(0, 64, 16):
            loss = torch.nn.functional.cross_entropy(net(X[i:i + 16]), Y[i:i + 16])
            opt.zero_grad()
            loss.backward()
            opt.step()
    net, opt = flor.SkipBlock.end(net, opt)
    # HINDSIGHT
    net.eval()
    with torch.no_grad():
        flor.log("loss", torch.nn.functional.cross_entropy(net(X), Y).item())
    net.train()
