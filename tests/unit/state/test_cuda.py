"""The CUDA snapshot path: pinned buffers, asynchronous copies on a side stream. Runs only
where a GPU is present (skipped on CPU-only machines such as CI's)."""

from __future__ import annotations

import json

import pytest
import torch

from flor.state import BufferPool, TreeCache, capture_rng, diff_nodes, restore, restore_rng, snapshot

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_async_snapshot_of_cuda_state_is_exact_while_training_goes_on():
    torch.manual_seed(0)
    net = torch.nn.Linear(256, 256).cuda()
    opt = torch.optim.Adam(net.parameters())
    net(torch.randn(8, 256, device="cuda")).sum().backward()
    opt.step()
    expected = {k: v.detach().cpu().clone() for k, v in net.state_dict().items()}
    pool = BufferPool()
    pending = snapshot([net, opt], pool=pool)
    # the CUDA tensors' buffers are pinned (weight, bias, Adam's exp_avg and exp_avg_sq); Adam's
    # step counts stay on the CPU, and so do their buffers
    assert [b.is_pinned() for b in pending.buffers].count(True) == 6 and pending.ready is not None
    for _ in range(3):  # training mutates the tensors right after end(): the copy must not see it
        net(torch.randn(8, 256, device="cuda")).sum().backward()
        opt.step()
    blobs = {}
    tree = pending.materialize(lambda data, h: blobs.__setitem__(h, bytes(data)))
    net2 = torch.nn.Linear(256, 256).cuda()
    opt2 = torch.optim.Adam(net2.parameters())
    restore([net2, opt2], tree, blobs.__getitem__)
    for k, v in net2.state_dict().items():
        assert v.is_cuda and torch.equal(v.cpu(), expected[k])
    assert diff_nodes(tree, snapshot([net2, opt2], copy=False).materialize()) == []


def test_cuda_rng_roundtrip():
    torch.cuda.init()
    state = capture_rng()
    assert "cuda" in state
    a = torch.rand(4, device="cuda")
    restore_rng(state)
    assert torch.equal(torch.rand(4, device="cuda"), a)


def _tree(pending) -> tuple[dict, dict]:
    blobs: dict = {}
    tree = pending.materialize(lambda data, digest: blobs.__setitem__(digest, bytes(data)))
    return json.loads(json.dumps(tree)), blobs


def _cuda_training():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.BatchNorm1d(128), torch.nn.Linear(128, 3)).cuda()
    net[0].weight.data = net[0].weight.data.t().contiguous().t()  # a transposed (non-contiguous) parameter
    opt = torch.optim.Adam(net.parameters())  # its step counts stay on the CPU: a block of both
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)

    def train(n: int = 2) -> None:
        for _ in range(n):
            net(torch.randn(16, 64, device="cuda")).sum().backward()
            opt.step()
            opt.zero_grad()
            sched.step()

    train()
    return net, opt, sched, train


def test_the_fast_path_copies_cuda_state_asynchronously_and_exactly():
    """The TreeCache walks CUDA tensors too: pinned buffers, copies on a side stream, the
    training stream waiting for them on the GPU. Its snapshots are the full encoding's trees
    and bytes, holding end()-time values while training goes on at once."""
    net, opt, sched, train = _cuda_training()
    objs = [net, opt, sched, {"epoch": 3}]
    cache = TreeCache()
    for expected_kind in ("learned", "fast", "fast"):
        expected = _tree(snapshot(objs, copy=False))
        pending = snapshot(objs, cache=cache)
        assert pending.encoded == expected_kind and pending.ready is not None
        pinned = [t.is_pinned() for t in pending.buffer_set]
        # the model's tensors and Adam's exp_avg and exp_avg_sq (CUDA); Adam's step counts (CPU)
        assert pinned.count(True) == len(net.state_dict()) + 2 * len(list(net.parameters()))
        assert pinned.count(False) == len(list(net.parameters()))
        train(3)  # changes every CUDA tensor right after end()
        assert _tree(pending) == expected
        train(1)
    assert cache.sets <= 2


def test_a_tensor_that_moves_device_relearns_the_template():
    """The signature holds each tensor's device: the same shapes on another device are another
    tree (its nodes name the device), never the old template."""
    state = {"w": torch.arange(6.0, device="cuda")}
    cache = TreeCache()
    assert snapshot([state], cache=cache).encoded == "learned"
    assert snapshot([state], cache=cache).encoded == "fast"
    state["w"] = state["w"].cpu()
    moved = snapshot([state], cache=cache)
    assert moved.encoded == "learned" and moved.ready is None
    tree, _ = _tree(moved)
    assert _tree(snapshot([state], copy=False))[0] == tree and '"device": "cpu"' in json.dumps(tree)
