"""Capture and restore of every supported kind of object, and of the RNGs, in order."""

from __future__ import annotations

import random
from collections import OrderedDict

import numpy as np
import pytest
import torch

from flor.errors import StateError
from flor.state import capture_rng, diff_nodes, restore, restore_all, snapshot, snapshot_rng


class MemoryBlobs(dict):
    def put(self, data, digest):
        self[digest] = bytes(data)


def roundtrip(obj):
    """Capture ``obj`` into raw blobs; return (tree, blobs)."""
    blobs = MemoryBlobs()
    tree = snapshot(obj).materialize(blobs.put)
    return tree, blobs


def make_training():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.01, total_steps=100)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    return net, opt, sched, scaler


def train_steps(net, opt, sched, n=3):
    for _ in range(n):
        loss = net(torch.randn(16, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


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


class ConsumesRandomness:
    """An object whose restore draws random numbers, like a sampler that re-seeds itself."""

    def __init__(self):
        self.value = 0

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]
        torch.rand(10)
        np.random.rand(10)
        random.random()


def test_rng_is_restored_last():
    obj = ConsumesRandomness()
    torch.manual_seed(1)
    np.random.seed(1)
    random.seed(1)
    blobs = MemoryBlobs()
    objects = snapshot([obj]).materialize(blobs.put)
    rng = snapshot(capture_rng()).materialize(blobs.put)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(99)
    np.random.seed(99)
    random.seed(99)
    restore_all([ConsumesRandomness()], objects, rng, blobs.__getitem__)
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1]) and got[2] == expected[2]


def _leaves(pending):
    return [(node, bytes(data)) for node, data in pending.leaves()]


@pytest.mark.parametrize("variant", ["usual", "gauss drawn", "words listed", "numpy int", "pcg64", "extra key"])
def test_the_rng_fast_path_encodes_as_the_general_walk(variant):
    """The writer's ``snapshot_rng`` gives the tree and leaves ``snapshot`` would: for the usual
    capture by its own path, for any other shape by falling back (a wrong fast tree would
    restore the wrong generator state on replay)."""
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    if variant == "gauss drawn":
        np.random.standard_normal(), random.gauss(0, 1)
    state = capture_rng()
    if variant == "words listed":  # an older flor's recording keeps Python's words as numbers
        state["python"] = random.getstate()
    elif variant == "numpy int":
        state["numpy"]["state"]["pos"] = np.int64(state["numpy"]["state"]["pos"])
    elif variant == "pcg64":
        state["numpy"] = np.random.PCG64(1).state
    elif variant == "extra key":
        state["cuda"] = [torch.zeros(8, dtype=torch.uint8)]
    fast, slow = snapshot_rng(state), snapshot(state, copy=False)
    assert fast.tree == slow.tree and _leaves(fast) == _leaves(slow)
    blobs = MemoryBlobs()
    if variant in ("usual", "gauss drawn"):
        expected = (random.random(), np.random.rand(), torch.rand(1))
        random.seed(9), np.random.seed(9), torch.manual_seed(9)
        restore_all([], snapshot([]).materialize(blobs.put), fast.materialize(blobs.put), blobs.__getitem__)
        assert (random.random(), np.random.rand(), torch.rand(1)) == expected


@pytest.mark.parametrize("variant", ["seeded", "spare deviates", "set_state", "long run", "extra key"])
def test_the_raw_rng_capture_reads_what_getstate_gives(variant):
    """``capture_rng(raw=True)`` reads Python's and NumPy's generators from memory (issue #13):
    it must give the same states as ``getstate``/``get_state`` (a wrong offset would record a
    state replay restores wrongly), encode to the same tree and leaves, and restore."""
    from flor.state.rng import NumpyRaw

    random.seed(11), np.random.seed(11), torch.manual_seed(11)
    if variant == "spare deviates":  # gauss_next and has_gauss/gauss set
        random.gauss(0, 1), np.random.standard_normal()
    elif variant == "set_state":
        np.random.set_state(np.random.RandomState(5).get_state())
        random.setstate(random.Random(6).getstate())
    elif variant == "long run":  # positions mid-way through the word arrays
        [random.random() for _ in range(1000)], np.random.rand(1001)
    raw, plain = capture_rng(raw=True), capture_rng()
    if variant == "extra key":  # as with CUDA generators: the general walk, from get_state's form
        raw["cuda"] = plain["cuda"] = [torch.zeros(8, dtype=torch.uint8)]
    assert isinstance(raw["numpy"], NumpyRaw)  # this machine's NumPy and CPython: read raw
    assert raw["python"] == plain["python"]
    got, want = raw["numpy"].as_dict(), plain["numpy"]
    assert np.array_equal(got["state"]["key"], want["state"]["key"]) and got["state"]["key"].dtype == np.uint32
    assert {**got, "state": got["state"]["pos"]} == {**want, "state": want["state"]["pos"]}
    fast, slow = snapshot_rng(raw), snapshot(plain, copy=False)
    assert fast.tree == slow.tree and _leaves(fast) == _leaves(slow)
    expected = (random.random(), np.random.rand(), np.random.standard_normal(), torch.rand(1))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    blobs = MemoryBlobs()
    restore_all([], snapshot([]).materialize(blobs.put), fast.materialize(blobs.put), blobs.__getitem__)
    assert (random.random(), np.random.rand(), np.random.standard_normal(), torch.rand(1)) == expected


def test_the_raw_rng_capture_falls_back_where_it_cannot_read():
    """Another bit generator behind NumPy's global functions, or a replaced ``random`` instance:
    ``get_state``/``getstate`` as before, never a misread."""
    saved_bitgen = np.random.mtrand._rand._bit_generator
    saved_inst = random._inst
    try:
        np.random.set_bit_generator(np.random.PCG64(3))
        random._inst = type("Mine", (random.Random,), {})(4)
        state = capture_rng(raw=True)
        assert state["numpy"] == np.random.get_state(legacy=False) and state["numpy"]["bit_generator"] == "PCG64"
        assert state["python"][1] == capture_rng()["python"][1]
    finally:
        np.random.set_bit_generator(saved_bitgen)
        random._inst = saved_inst


def test_snapshot_is_a_copy():
    t = torch.zeros(4)
    pending = snapshot([t])
    t += 1  # training goes on before the background worker materializes
    blobs = MemoryBlobs()
    tree = pending.materialize(blobs.put)
    assert torch.equal(restore([None], tree, blobs.__getitem__)[0], torch.zeros(4))


def test_diff_names_changed_leaves():
    net, opt, sched, _ = make_training()
    a = snapshot([net, 3], copy=False).materialize()
    with torch.no_grad():
        net[3].bias += 1
    b = snapshot([net, 4], copy=False).materialize()
    assert diff_nodes(a, b) == ["[0].3.bias", "[1]"]
    assert diff_nodes(a, a) == []


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


def test_pooled_snapshots_reuse_buffers_and_stay_exact():
    from flor.state import BufferPool

    pool = BufferPool()
    net = torch.nn.Linear(64, 32)
    first = snapshot([net], pool=pool)
    buffers = {b.data_ptr() for b in first.buffers}
    blobs = MemoryBlobs()
    tree1 = first.materialize(blobs.put)
    assert pool.nbytes == sum(p.numel() * 4 for p in net.parameters())  # back in the pool
    with torch.no_grad():
        net.weight += 1
    second = snapshot([net], pool=pool)
    assert {b.data_ptr() for b in second.buffers} == buffers  # the same memory, no new allocation
    with torch.no_grad():
        net.weight -= 1  # training goes on: the snapshot must hold the values at end() time
    tree2 = second.materialize(blobs.put)
    assert diff_nodes(tree1, tree2) == ["[0].weight"]
    restored = restore([torch.nn.Linear(64, 32)], tree2, blobs.__getitem__)[0]
    assert torch.equal(restored.weight, net.weight + 1) and torch.equal(restored.bias, net.bias)


def test_the_pool_never_asks_torch_whether_a_buffer_is_pinned(monkeypatch):
    """On a GPU machine ``Tensor.is_pinned()`` asks the CUDA driver, which in some torch
    releases initializes CUDA in a process that trains on the CPU; the pool knows which
    buffers it pinned."""
    from flor.state import BufferPool

    def asked(self, *args, **kwargs):
        raise AssertionError("BufferPool asked torch whether a buffer is pinned")

    pool = BufferPool()
    net = torch.nn.Linear(64, 32)
    first = snapshot([net], pool=pool)
    buffers = {b.data_ptr() for b in first.buffers}
    monkeypatch.setattr(torch.Tensor, "is_pinned", asked)
    first.materialize(MemoryBlobs().put)  # gives its buffers back
    monkeypatch.undo()
    assert {b.data_ptr() for b in snapshot([net], pool=pool).buffers} == buffers  # reused as unpinned buffers
    assert pool.nbytes == 0


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
