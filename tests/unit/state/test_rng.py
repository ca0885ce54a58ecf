"""flor.state.rng: random generators are captured, compared and restored last. Python's state is
captured as raw bytes (comparable with the older 625-number form), the fast capture reads what
``getstate`` gives, and CUDA generators are restored and compared for the devices both the
recording and this process have.
"""

from __future__ import annotations

import json
import random
import struct

import numpy as np
import pytest
import torch

from flor.errors import ConfigError, StateError
from flor.state import (
    capture_rng,
    cuda_undrawn,
    decode,
    diff_rng,
    restore_all,
    restore_rng,
    snapshot,
    snapshot_rng,
)


class MemoryBlobs(dict):
    def put(self, data, digest):
        self[digest] = bytes(data)


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


def materialized(pending) -> tuple[dict, dict]:
    blobs: dict[str, bytes] = {}
    tree = pending.materialize(lambda data, digest: blobs.__setitem__(digest, bytes(data)))
    return json.loads(json.dumps(tree)), blobs


def test_python_rng_state_is_raw_bytes():
    random.seed(3)
    state = capture_rng()
    assert isinstance(state["python"][1], bytes) and len(state["python"][1]) == 625 * 4
    tree = snapshot(state, copy=False)
    blobs: dict[str, bytes] = {}
    tree = tree.materialize(lambda d, h: blobs.__setitem__(h, bytes(d)))
    expected = [random.random() for _ in range(5)]
    restore_rng(decode(tree, blobs.__getitem__))
    assert [random.random() for _ in range(5)] == expected


@pytest.mark.parametrize("draw", ["nothing", "python", "numpy", "numpy gauss", "torch"])
def test_same_rng_sees_any_generator_move(draw):
    from flor.state import same_rng

    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    before = capture_rng(raw=True)
    {"nothing": lambda: None, "python": random.random, "numpy": np.random.rand,
     "numpy gauss": np.random.standard_normal, "torch": lambda: torch.rand(1)}[draw]()
    assert same_rng(before, capture_rng(raw=True)) is (draw == "nothing")
    assert not same_rng(capture_rng(), capture_rng())  # get_state's form: never assumed the same


def test_same_rng_compares_cuda_generators_by_their_bytes():
    """A capture of a process that made CUDA's context also holds each device's generator
    state (CPU byte tensors, ``get_rng_state_all``): the same bytes are the same state, so a
    GPU script's ``rng_start`` points at the last checkpoint's too; any change, or one side
    without them, is not."""
    from flor.state import same_rng

    torch.manual_seed(1)
    cuda = [torch.arange(16, dtype=torch.uint8), torch.arange(16, 32, dtype=torch.uint8)]  # two devices' states
    before = {**capture_rng(raw=True), "cuda": [t.clone() for t in cuda]}
    assert same_rng(before, {**capture_rng(raw=True), "cuda": [t.clone() for t in cuda]})
    moved = [cuda[0], cuda[1].clone()]
    moved[1][-1] += 1  # the second device's offset moved
    assert not same_rng(before, {**capture_rng(raw=True), "cuda": moved})
    assert not same_rng(before, {**capture_rng(raw=True), "cuda": cuda[:1]})
    assert not same_rng(before, capture_rng(raw=True)) and not same_rng(capture_rng(raw=True), before)


@pytest.mark.parametrize("setup", ["seeded", "set_state", "gauss spare", "reseeded after reading"])
def test_a_raw_capture_holds_the_states_of_its_time(setup):
    """capture_rng(raw=True) reads Python's and NumPy's generators from memory and clones
    torch's; encoded later (on the writer, after training drew more numbers) it is exactly what
    capture_rng() gave at the same instant, whatever set the generators."""
    from flor.state import snapshot_rng

    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    if setup == "set_state":
        random.setstate(random.Random(9).getstate())
        np.random.set_state(np.random.RandomState(9).get_state())
        torch.set_rng_state(torch.Generator().manual_seed(9).get_state())
    elif setup == "gauss spare":
        np.random.standard_normal(), random.gauss(0, 1)  # a spare deviate kept by each
    elif setup == "reseeded after reading":
        capture_rng(raw=True)
        random.seed(4), np.random.seed(4), torch.manual_seed(4)
    torch.rand(3), np.random.rand(2), random.random()
    raw, plain = capture_rng(raw=True), capture_rng()

    def draws():
        return torch.rand(5).tolist(), np.random.rand(5).tolist(), np.random.standard_normal(), random.random()

    expected = draws()  # training goes on before the writer encodes the capture
    a, b = snapshot_rng(raw), snapshot_rng(plain)
    (tree, blobs), (tree_b, blobs_b) = materialized(a), materialized(b)
    assert tree == tree_b and blobs == blobs_b
    restore_rng(decode(tree, blobs.__getitem__))
    assert draws() == expected


def _cuda(*offsets: int, seed: int = 42) -> list[torch.Tensor]:
    return [torch.tensor([seed, o], dtype=torch.int64).view(torch.uint8) for o in offsets]


def test_restore_sets_the_devices_this_process_has(monkeypatch):
    calls: list[tuple[int, bytes]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: calls.append((device, state.numpy().tobytes())))
    state = {**capture_rng(), "cuda": _cuda(96, 0, 0, 0)}
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    restore_rng(state)
    assert calls == [(0, struct.pack("=Qq", 42, 96))]
    calls.clear()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)  # more than the recording saw: its devices
    restore_rng(state)
    assert [device for device, _ in calls] == [0, 1, 2, 3]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"drew random numbers on CUDA devices 2, 3 \(it saw 4 GPUs\) and this process sees 2; replay where 4 or more GPUs"):
        restore_rng({**state, "cuda": _cuda(96, 0, 8, 8)})
    with pytest.raises(StateError, match="not a list of device states"):
        restore_rng({**state, "cuda": "x"})


def test_diff_rng_compares_the_devices_both_have():
    def tree(cuda: list[torch.Tensor]) -> dict:
        return snapshot({**capture_rng(), "cuda": cuda}, copy=False).materialize()

    def undrawn(recorded: list, now: list):
        return lambda r, n: cuda_undrawn(recorded[n:]) and cuda_undrawn(now[r:])

    recorded, one = _cuda(96, 0, 0, 0), _cuda(96)
    assert diff_rng(tree(recorded), tree(one), undrawn(recorded, one)) == []
    assert diff_rng(tree(one), tree(recorded), undrawn(one, recorded)) == []
    assert diff_rng(tree(recorded), tree(one)) == ["cuda.<devices>"]  # unknown: a difference
    drawn = _cuda(96, 0, 8, 0)
    assert diff_rng(tree(drawn), tree(one), undrawn(drawn, one)) == ["cuda.<devices>"]
    assert diff_rng(tree(recorded), tree(_cuda(100)), undrawn(recorded, one)) == ["cuda[0]"]
    assert not cuda_undrawn([torch.zeros(8, dtype=torch.uint8)])  # another form: not known to be undrawn


def test_fingerprints_name_the_generators_drawn_from():
    """What flor.watch.draws compares at every block run (it replaced comparing two captures)."""
    from flor.state.rng import fingerprints

    a = fingerprints()
    assert {k for k, v in fingerprints().items() if a[k] != v} == set()
    a = fingerprints()
    torch.rand(1)
    random.random()
    assert {k for k, v in fingerprints().items() if a[k] != v} == {"torch", "python"}


def test_a_forked_generator_put_back_is_not_a_draw() -> None:
    """``torch.random.fork_rng()`` around hindsight code (dropout drawn in a model's copy) puts the
    state back: no draw between blocks (read from torch's memory, a spare deviate's flag it leaves
    read as one: FL325 over values equal to a full run's, tests/e2e/test_module_mode.py)."""
    import copy

    import torch

    from flor.state.rng import fingerprints

    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    torch.manual_seed(0)
    torch.randn(3)
    for _ in range(3):
        before = fingerprints()
        with torch.random.fork_rng(), torch.no_grad():
            copy.deepcopy(net)(torch.ones(8, 4))
        assert fingerprints() == before
        torch.randn(1)  # a draw after it still is one
        assert fingerprints()["torch"] != before["torch"]
