"""A module with plain attributes the block changes (a temperature annealed each epoch, a count
of epochs trained), besides a buffer it counts in. Used by tests/test_module_attrs.py.

A module is checkpointed through its state_dict: the buffer is restored, the attributes are not,
so a replay that restores the block reads them as they were before it; the recording must say so.
A layer's count kept in its own extra state (get_extra_state) is in its state_dict: not named.
"""

import torch

import flor

torch.manual_seed(0)


class Counted(torch.nn.Linear):
    """A layer that keeps what it counts in its own extra state: in its state_dict, restored."""

    def __init__(self, *args: int) -> None:
        super().__init__(*args)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(x)

    def get_extra_state(self) -> dict:
        return {"calls": self.calls}

    def set_extra_state(self, state: dict) -> None:
        self.calls = state["calls"]


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = Counted(4, 3)
        self.register_buffer("seen", torch.zeros((), dtype=torch.long))
        self.temperature = 1.0
        self.epochs_trained = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += x.shape[0]
        return self.fc(x) / self.temperature


X, Y = torch.randn(48, 4), torch.randint(0, 3, (48,))
net = Net()
model = net  # the same module under a second name: its attributes are named once
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for epoch in flor.it(range(3)):
    if flor.SkipBlock.step_into("train"):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(X), Y).backward()
        opt.step()
        net.temperature *= 0.9
        net.epochs_trained += 1
    net, opt = flor.SkipBlock.end(net, opt)
    flor.log("seen", net.seen.item())
    # HINDSIGHT
