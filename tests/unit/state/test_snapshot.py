"""flor.state (encode, decode): capture and restore of every supported kind of object, in place
and exactly; errors name the problem.
"""

from __future__ import annotations

import random
from collections import OrderedDict

import numpy as np
import pytest
import torch

from flor.errors import StateError
from flor.state import restore, snapshot

from helpers import make_training, train_steps


class MemoryBlobs(dict):
    def put(self, data, digest):
        self[digest] = bytes(data)


def roundtrip(obj):
    """Capture ``obj`` into raw blobs; return (tree, blobs)."""
    blobs = MemoryBlobs()
    tree = snapshot(obj).materialize(blobs.put)
    return tree, blobs


def test_training_objects_restore_in_place_exactly():
    net, opt, sched, scaler = make_training()
    train_steps(net, opt, sched)
    tree, blobs = roundtrip([net, opt, sched, scaler, 7])
    expected = [p.clone() for p in net.state_dict().values()]
    expected_opt = opt.state_dict()
    lr = sched.get_last_lr()

    net2, opt2, sched2, scaler2 = make_training()
    ids = [id(net2), id(opt2), id(sched2), id(scaler2)]
    out = restore([net2, opt2, sched2, scaler2, 0], tree, blobs.__getitem__)
    assert [id(o) for o in out[:4]] == ids  # in place
    assert out[4] == 7  # immutables come back as values
    for a, b in zip(expected, net2.state_dict().values()):
        assert torch.equal(a, b)
    for k, st in expected_opt["state"].items():
        for name, value in st.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(opt2.state_dict()["state"][k][name]))
    assert sched2.get_last_lr() == lr
    assert scaler2.get_scale() == 1024.0
    # training continues identically from the restored objects
    torch.manual_seed(5)
    train_steps(net, opt, sched)
    torch.manual_seed(5)
    train_steps(net2, opt2, sched2)
    for a, b in zip(net.parameters(), net2.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),  # non-contiguous
        torch.tensor(3.5, dtype=torch.float64),  # 0-d
        torch.empty(0, 3),  # empty
        torch.randn(5).to(torch.bfloat16),
        torch.tensor([True, False, True]),
        torch.randint(0, 100, (4, 4), dtype=torch.int64),
        torch.randn(3, dtype=torch.complex64),
    ],
)
def test_tensors_roundtrip_bit_exact(tensor):
    tree, blobs = roundtrip({"t": tensor})
    out = restore({}, tree, blobs.__getitem__)["t"]
    assert out.dtype == tensor.dtype and out.shape == tensor.shape
    assert torch.equal(out, tensor)


def test_containers_objects_and_generators():
    class Holder:
        def __init__(self):
            self.weights = torch.ones(3)
            self.history = [1.0, 2.0]
            self.table = {1: "a", (2, 3): np.arange(4)}
            self.rng = np.random.default_rng(3)
            self.pyrng = random.Random(4)
            self.gen = torch.Generator().manual_seed(5)
            self.tag = frozenset({"x"})  # no JSON form: falls back to cloudpickle

    h = Holder()
    state = OrderedDict(a=1)
    tree, blobs = roundtrip([h, state, [1, 2], {"k": torch.zeros(2)}, np.float32(1.5)])
    expected = (h.rng.random(), h.pyrng.random(), torch.rand(1, generator=h.gen))

    h2 = Holder()
    h2.weights, h2.history, h2.tag = torch.zeros(3), [], None
    h2.rng.random(), h2.pyrng.random(), torch.rand(1, generator=h2.gen)  # advance: restore must rewind
    lst, dct = [9], {"old": 1}
    out = restore([h2, OrderedDict(), lst, dct, 0], tree, blobs.__getitem__)
    assert out[0] is h2 and out[2] is lst and out[3] is dct
    assert torch.equal(h2.weights, torch.ones(3)) and h2.history == [1.0, 2.0]
    assert h2.table[1] == "a" and np.array_equal(h2.table[(2, 3)], np.arange(4))
    assert h2.tag == frozenset({"x"})
    assert (h2.rng.random(), h2.pyrng.random(), torch.rand(1, generator=h2.gen)) == expected
    assert lst == [1, 2] and list(dct) == ["k"] and out[4] == np.float32(1.5)
    assert isinstance(out[4], np.float32)


def test_module_metadata_survives_for_versioned_loading():
    net = torch.nn.BatchNorm1d(3)
    tree, blobs = roundtrip(net)
    assert tree["v"]["meta"]  # Module.state_dict()._metadata
    net2 = torch.nn.BatchNorm1d(3)
    restore(net2, tree, blobs.__getitem__)
    assert torch.equal(net2.num_batches_tracked, net.num_batches_tracked)


def test_snapshot_is_a_copy():
    t = torch.zeros(4)
    pending = snapshot([t])
    t += 1  # training goes on before the background worker materializes
    blobs = MemoryBlobs()
    tree = pending.materialize(blobs.put)
    assert torch.equal(restore([None], tree, blobs.__getitem__)[0], torch.zeros(4))


def test_errors_name_the_problem():
    loop = []
    loop.append(loop)
    with pytest.raises(StateError, match="contains itself"):
        snapshot([loop])
    with pytest.raises(StateError, match="cannot capture"):
        snapshot([(i for i in range(3))])  # a generator cannot be pickled
    net = torch.nn.Linear(2, 2)
    tree, blobs = roundtrip([net])
    with pytest.raises(StateError, match="same objects"):
        restore([5], tree, blobs.__getitem__)
    tree, blobs = roundtrip([torch.nn.Linear(2, 3)])
    with pytest.raises(StateError, match="built differently"):
        restore([net], tree, blobs.__getitem__)
