"""The CUDA snapshot path: pinned buffers, asynchronous copies on a side stream. Runs only
where a GPU is present (skipped on CPU-only machines such as CI's)."""

from __future__ import annotations

import pytest
import torch

from flor.state import BufferPool, capture_rng, diff_nodes, restore, restore_rng, snapshot

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
    assert all(b.is_pinned() for b in pending.buffers) and pending.ready is not None
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
