"""flor.state.grads: a block's gradients captured and restored, a missing one kept as None,
damage named.
"""

from __future__ import annotations

import pytest
import torch

from flor.errors import StateError
from flor.state import snapshot


class MemoryBlobs(dict):
    def put(self, data, digest):
        self[digest] = bytes(data)


def test_gradients_roundtrip_with_none_kept_and_damage_named():
    from flor.errors import CheckpointError
    from flor.state.grads import module_grads, restore_grads
    from flor.store.manifest import check_node

    torch.manual_seed(0)
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)
    b.bias.requires_grad_(False)
    b(a(torch.randn(4, 3))).sum().backward()
    objs = (a, "not a module", [torch.optim.SGD(a.parameters(), lr=0.1), b])
    blobs = MemoryBlobs()
    node = snapshot(module_grads(objs)).materialize(blobs.put)
    check_node(node, "grads")
    assert node["k"] == ["0", "2.1"]
    params = [(m, n, p) for m in (a, b) for n, p in m.named_parameters()]
    recorded = {(id(m), n): p.grad.clone() for m, n, p in params if p.grad is not None}
    assert len(recorded) == 3

    a.weight.grad.add_(1)  # what a replay left there: stale values, None, a gradient where none was recorded
    b.weight.grad = None
    b.bias.grad = torch.ones(1)
    restore_grads(objs, node, blobs.__getitem__)
    for m, n, p in params:
        if (id(m), n) in recorded:
            assert torch.equal(p.grad, recorded[id(m), n]) and p.grad.data_ptr() != recorded[id(m), n].data_ptr()
    assert b.bias.grad is None  # none recorded: None again (an optimizer skips it; a zero would move Adam)

    with pytest.raises(CheckpointError, match=r"argument 2.1, which is not a module now"):
        restore_grads((a, "x", []), node, blobs.__getitem__)
    with pytest.raises(CheckpointError, match=r"no parameter named"):
        restore_grads((a, "x", [None, torch.nn.Sequential(b)]), node, blobs.__getitem__)
    with pytest.raises(CheckpointError, match=r"shape \(1, 2\) for a torch.float32 parameter of shape \(1, 3\)"):
        restore_grads((a, "x", [None, torch.nn.Linear(3, 1)]), node, blobs.__getitem__)
    before = a.weight.grad.clone()
    with pytest.raises(CheckpointError):  # checked before anything is set
        restore_grads((a, "x", [None, torch.nn.Linear(3, 1)]), node, blobs.__getitem__)
    assert torch.equal(a.weight.grad, before)
    emb = torch.nn.Embedding(5, 2, sparse=True)
    emb(torch.tensor([1])).sum().backward()
    with pytest.raises(StateError, match="sparse_coo tensor, which flor does not store"):  # never pickled
        module_grads([emb])
