"""checkpointables gives SkipBlock.end what accelerator.save_state saves, and flor's capture and
restore of them brings a real Accelerator's objects back (in process, on the CPU)."""

from __future__ import annotations

import pytest

accelerate = pytest.importorskip("accelerate")
torch = pytest.importorskip("torch")

from flor.integrations.accelerate import checkpointables  # noqa: E402
from flor.state import restore, snapshot  # noqa: E402


class Counter:
    """A registered object: what register_for_checkpointing takes (state_dict, load_state_dict)."""

    def __init__(self) -> None:
        self.n = 0

    def state_dict(self) -> dict:
        return {"n": self.n}

    def load_state_dict(self, state: dict) -> None:
        self.n = state["n"]


def prepared(seed: int):
    torch.manual_seed(seed)
    acc = accelerate.Accelerator(cpu=True)
    net = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    loader = torch.utils.data.DataLoader(torch.randn(4, 3), batch_size=2)
    net, opt, sched, loader = acc.prepare(net, opt, sched, loader)
    counter = Counter()
    acc.register_for_checkpointing(counter)
    return acc, net, opt, sched, loader, counter


def test_checkpointables_are_what_save_state_saves() -> None:
    acc, net, opt, sched, loader, counter = prepared(0)
    objs = checkpointables(acc)
    assert objs[:3] == [net, opt, sched]
    assert objs[-1] is counter
    assert loader not in objs  # a data loader without a position of its own: nothing to save


def test_flor_captures_and_restores_them_in_place() -> None:
    acc, net, opt, sched, loader, counter = prepared(0)
    for batch in loader:  # one epoch: the state a SkipBlock.end would capture
        acc.backward(net(batch).square().mean())
        opt.step()
        opt.zero_grad()
        counter.n += 1
    sched.step()
    blobs: dict = {}
    tree = snapshot(checkpointables(acc)).materialize(lambda data, digest: blobs.__setitem__(digest, bytes(data)))

    acc2, net2, opt2, sched2, _, counter2 = prepared(1)  # another process's fresh objects
    restore(checkpointables(acc2), tree, blobs.__getitem__)
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), net2.state_dict().values()))
    assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], opt2.state_dict()["state"][0]["momentum_buffer"])
    assert sched2.get_last_lr() == sched.get_last_lr() == [0.05]
    assert counter2.n == counter.n == 2
