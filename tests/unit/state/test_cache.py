"""What makes a checkpoint cheap must not make it wrong (issue #13): flor.state.cache.

The fast snapshot (``TreeCache``: the block's tree structure reused while its objects keep it,
tensors copied in one call into a reused buffer set) gives exactly the tree a full encoding
gives, holds the values of end() time while training goes on, falls back to the full encoding
for what it does not know and for a changed structure, and keeps at most one spare buffer set
within its memory.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import random
import types

import numpy as np
import pytest
import torch

from flor.state import (
    PACK_ALL_BYTES,
    PACK_LEAF_BYTES,
    PackIndex,
    TreeCache,
    diff_nodes,
    hash_and_pack,
    restore,
    snapshot,
)
from flor.store.manifest import canonical_json, check_node

from helpers import make_training, train_steps


def materialized(pending) -> tuple[dict, dict]:
    blobs: dict[str, bytes] = {}
    tree = pending.materialize(lambda data, digest: blobs.__setitem__(digest, bytes(data)))
    return json.loads(json.dumps(tree)), blobs


def full(objs) -> dict:
    return json.loads(json.dumps(snapshot(objs, copy=False).materialize()))


def fast_as_full(objs, cache) -> tuple[bool, dict, dict]:
    """Snapshot ``objs`` with ``cache``; check the writer's rendered text and the built tree are
    the full encoding's (every leaf its own blob, as ``full`` stores them). Returns whether the
    fast path was taken, the tree and its blobs."""
    p = snapshot(objs, cache=cache)
    took = p.build is not None
    stored, _ = hash_and_pack([p], threshold=0, pack_all=-1)
    blobs = {digest: bytes(data) for data, digest in stored}
    expected = full(objs)
    assert p.canonical() == canonical_json(expected)  # the writer's text: rendered on the fast path
    tree = json.loads(json.dumps(p.built()))
    assert json.dumps(tree, sort_keys=True) == json.dumps(expected, sort_keys=True)
    p.release()
    return took, tree, blobs


@pytest.mark.parametrize("layout", ["one pack", "own blobs", "mixed"])
def test_the_rendered_tree_text_is_its_canonical_json(layout):
    """The writer renders a fast snapshot's manifest text from the block's template instead of
    building the tree and serializing it; it must be byte for byte ``canonical_json`` of the
    tree (a reader re-serializes the parsed manifest to check its sha256), whatever the values
    became: NaN and infinities, escapes and non-ASCII text, None, and leaves in a pack
    (``"n"``, ``"o"``, ``"x"``) or in their own blobs."""
    net, opt, sched, scaler = make_training()
    big = torch.nn.Linear(200, 100)  # a 80 KB weight: its own blob unless everything is packed
    train_steps(net, opt, sched, n=2)
    objs = [net, opt, sched, scaler, big, 7, 0.5, "tag", None, True, {"k": 1.0, "e": "x"}]
    cache, index = TreeCache(), PackIndex()
    snapshot(objs, cache=cache).release()
    assert not cache.off and cache.sig is not None, "learned"
    pack_all, threshold = {"one pack": (PACK_ALL_BYTES, PACK_LEAF_BYTES), "own blobs": (-1, 0),
                           "mixed": (0, PACK_LEAF_BYTES)}[layout]
    values = [(8, float("nan"), "ünï \"q\" \\ \n\t\x01", None, False, {"k": float("inf"), "e": ""}),
              (9, -0.0, "", "now a str", True, {"k": 1e-300, "e": "\u2603"}),  # another type: a new template
              (-3, float("-inf"), "</script>", "", False, {"k": 1e300, "e": "/"})]
    for v in values:
        train_steps(net, opt, sched, n=1)
        retyped = type(objs[8]) is not type(v[3])
        objs[5:] = list(v)
        if retyped:  # the full encoding learns the new template
            snapshot(objs, cache=cache).release()
        pending = snapshot(objs, cache=cache)
        assert pending.build is not None, "the fast path"
        _, packed = hash_and_pack([pending], index, threshold=threshold, pack_all=pack_all)
        index.remember(packed)
        text = pending.canonical()
        assert pending.light is not None, "rendered, the tree not built"
        assert text == canonical_json(pending.built())
        pending.release()


def test_the_template_text_is_made_in_the_job_of_the_first_checkpoint(monkeypatch):
    """``TreeCache.prime`` (the writer, first checkpoint of a block) makes the template's text, so
    the next checkpoint, whose cost the budget takes as its estimate, only renders it."""
    import flor.state.cache as cache_module

    net, opt, sched, _ = make_training()
    train_steps(net, opt, sched, n=1)
    cache = TreeCache()
    snapshot([net, opt, sched], cache=cache).release()
    cache.prime()
    made: list = []
    monkeypatch.setattr(cache_module._Text, "checked", classmethod(lambda cls, *args: made.append(args)))
    train_steps(net, opt, sched, n=1)
    pending = snapshot([net, opt, sched], cache=cache)
    hash_and_pack([pending], PackIndex())
    assert pending.canonical() == canonical_json(pending.built()) and made == []
    cache.prime()  # nothing learned since: nothing to do
    assert made == []


def test_fast_snapshot_is_the_full_encoding_and_a_copy():
    net, opt, sched, scaler = make_training()
    train_steps(net, opt, sched, n=2)
    objs = [net, opt, sched, scaler, 7, 0.5, "tag", [1, 2.5, None, True]]
    cache = TreeCache()
    first = snapshot(objs, cache=cache)
    assert first.build is None and cache.sig is not None and cache.sets == 1  # full, then learned
    assert materialized(first)[0] == full(objs)
    for _ in range(3):
        train_steps(net, opt, sched, n=2)
        objs[4] += 1
        fast = snapshot(objs, cache=cache)
        assert fast.build is not None, "same structure: the fast path"
        assert fast.nbytes == snapshot(objs, copy=False).nbytes > 0  # what the writer's memory budget counts
        expected = full(objs)
        train_steps(net, opt, sched, n=2)  # training goes on before the writer gets to it
        objs[4] += 1
        tree, blobs = materialized(fast)
        assert tree == expected
        assert diff_nodes(tree, full(objs)), "the snapshot holds end()-time values"
    # and it restores: a fresh set of objects gets exactly the snapshotted state
    train_steps(net, opt, sched, n=2)
    fast = snapshot(objs, cache=cache)
    tree, blobs = materialized(fast)
    net2, opt2, sched2, scaler2 = make_training()
    restored = restore([net2, opt2, sched2, scaler2, 0, 0.0, "", []], tree, blobs.__getitem__)
    assert restored[4:] == objs[4:]
    for a, b in zip(net.state_dict().values(), net2.state_dict().values()):
        assert torch.equal(a, b)
    assert diff_nodes(full([net, opt, sched, scaler]), full([net2, opt2, sched2, scaler2])) == []


def test_a_spare_set_is_shaped_like_the_first_and_its_page_faults_are_not_gil_time():
    """The spare is made like the block's first buffer set (``empty_like``; page-aligned where
    the store writes a leaf around the page cache), and touching its large buffers is counted
    as time without the GIL (the budget's charge)."""
    from flor.state.cache import NOGIL_TOUCH_BYTES
    from flor.store.local import DIRECT_MIN, PAGE

    net = torch.nn.Sequential(torch.nn.Linear(512, 256), torch.nn.BatchNorm1d(256), torch.nn.Linear(256, 3))
    net[0].weight.data = net[0].weight.data.t().contiguous().t()  # a transposed (non-contiguous) parameter
    opt = torch.optim.Adam(net.parameters())
    net(torch.randn(4, 512)).sum().backward()
    opt.step()
    cache = TreeCache()
    first = snapshot([net, opt], cache=cache)  # the full encoding: its copies become the first set
    firsts = [t for _, t in first.tensors]
    held = snapshot([net, opt], cache=cache)  # the first set is still pending with the writer
    nogil: list[float] = []
    cache.top_up(nogil)
    assert cache.sets == 3  # the first, the one ``held`` made, the spare
    spare = cache._free[-1]
    assert [(t.shape, t.dtype) for t in spare] == [(t.shape, t.dtype) for t in firsts]
    assert all(t.is_contiguous() and not t.requires_grad for t in spare)
    big = [t for t in spare if t.numel() * t.element_size() >= DIRECT_MIN]
    assert big and all(t.data_ptr() % PAGE == 0 for t in big)
    assert len(nogil) == sum(t.numel() * t.element_size() >= NOGIL_TOUCH_BYTES for t in spare) > 0
    assert {t.data_ptr() for t in spare}.isdisjoint({t.data_ptr() for t in firsts + [t for _, t in held.tensors]})
    first.release(), held.release()
    opt.step()
    later = snapshot([net, opt], cache=cache)  # into a reused set (the spare's turn comes later): values exact
    assert later.build is not None  # the fast path
    full = snapshot([net, opt])
    assert len(later.tensors) == len(full.tensors)
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(later.tensors, full.tensors))
    later.release()


def test_buffer_sets_are_reused_and_one_spare_is_kept_once_the_writer_was_behind():
    net = torch.nn.Linear(64, 32)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(torch.randn(2, 64)).sum().backward()
    opt.step()
    cache = TreeCache()
    snapshot([net, opt], cache=cache).release()  # full encoding; its copies become set 1
    for _ in range(3):  # a writer that keeps up: its job's own set comes back, no spare is made
        a = snapshot([net, opt], cache=cache)
        cache.top_up()
        a.release()
    assert cache.sets == 1 and not cache.behind
    a = snapshot([net, opt], cache=cache)
    b = snapshot([net, opt], cache=cache)  # the writer is one behind: a still pending, a set made here
    assert cache.sets == 2 and cache.behind
    ptrs_a = {t.data_ptr() for _, t in a.tensors}
    ptrs_b = {t.data_ptr() for _, t in b.tensors}
    assert ptrs_a.isdisjoint(ptrs_b)
    cache.top_up()  # both pending: from now on the writer keeps a spare, pages touched
    assert cache.sets == 3
    a.release(), b.release()
    for _ in range(5):  # steady state: no new sets
        cache.top_up()
        snapshot([net, opt], cache=cache).release()
    assert cache.sets == 3
    small = TreeCache(memory=1000)  # the spare would not fit: none made
    snapshot([net, opt], cache=small).release()
    held = [snapshot([net, opt], cache=small), snapshot([net, opt], cache=small)]  # behind
    small.top_up()
    assert small.sets == 2 and small.behind
    for p in held:
        p.release()


def test_what_the_fast_walk_does_not_know_takes_the_full_path():
    net = torch.nn.Linear(3, 2)
    cases = [
        [net, np.array(["a", "b"])],                # an array of strings (torch has no such tensor)
        [net, {"when": datetime.date(2024, 1, 2)}],  # a leaf of its own kind (a date)
        [net, {"k": (1, 2)}, {1: "a", (1, 2): 3}],  # a tuple as a dict key
    ]
    for objs in cases:
        cache = TreeCache()
        for _ in range(2):
            p = snapshot(objs, cache=cache)
            assert p.build is None
            assert materialized(p)[0] == full(objs)
        assert cache.off
    # a changed structure (the optimizer's state appears after its first step) re-learns
    opt = torch.optim.Adam(net.parameters())
    cache = TreeCache()
    snapshot([net, opt], cache=cache).release()
    net(torch.randn(2, 3)).sum().backward()
    opt.step()
    changed = snapshot([net, opt], cache=cache)
    assert changed.build is None and materialized(changed)[0] == full([net, opt])
    again = snapshot([net, opt], cache=cache)
    assert again.build is not None and materialized(again)[0] == full([net, opt])


def _walks(obj):
    from flor.state.cache import _flatten

    out = []
    for direct in (True, False):
        sig, vals, tensors = [], [], []
        ok = _flatten(obj, sig, vals, tensors, direct=direct)
        out.append((ok, sig, vals, [(t.data_ptr(), t.stride()) for t in tensors]))
    return out


class _Extra(torch.nn.Linear):
    def get_extra_state(self):
        return {"calls": 3}

    def set_extra_state(self, state):
        pass


def _modules():
    torch.manual_seed(0)
    bn = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    bn(torch.randn(2, 1, 5, 5))  # num_batches_tracked moves; BatchNorm's _version is 2
    no_bias = torch.nn.Sequential(torch.nn.Linear(3, 3, bias=False), torch.nn.LayerNorm(3))
    holes = torch.nn.Module()
    holes.a, holes.gone = torch.nn.Linear(2, 2), None  # a submodule set to None
    holes.register_buffer("kept", torch.ones(2))
    holes.register_buffer("scratch", torch.zeros(2), persistent=False)
    holes.register_buffer("empty", None)
    nested = torch.nn.ModuleDict({"blocks": torch.nn.ModuleList([torch.nn.LSTM(3, 4), torch.nn.Embedding(5, 2)]),
                                  "head": torch.nn.TransformerEncoderLayer(8, 2, 16)})
    added = torch.ones(1)  # (the same tensor each time: the walks are compared by memory)
    hooked = torch.nn.Linear(2, 2)
    hooked.register_state_dict_post_hook(lambda m, sd, prefix, local: sd.__setitem__(prefix + "extra", added))
    pre = torch.nn.Sequential(torch.nn.Linear(2, 2))
    pre[0].register_state_dict_pre_hook(lambda m, prefix, keep_vars: None)
    own = torch.nn.Linear(2, 2)
    own.state_dict = lambda *a, **k: {"mine": added}  # an instance's own state_dict
    return {"batchnorm": bn, "no bias": no_bias, "holes": holes, "nested": nested, "post hook": hooked,
            "pre hook": pre, "own state_dict": own, "extra state": torch.nn.Sequential(_Extra(2, 2))}


def _optimizers():
    out = {}
    for name, make in {
        "sgd momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        "adam before a step": lambda p: torch.optim.Adam(p),
        "adamw two groups": lambda p: torch.optim.AdamW([{"params": p[:1], "lr": 0.1}, {"params": p[1:]}]),
        "rmsprop": lambda p: torch.optim.RMSprop(p, centered=True),
        "adagrad": lambda p: torch.optim.Adagrad(p),
    }.items():
        net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
        opt = make(list(net.parameters()))
        if name != "adam before a step":
            net(torch.randn(5, 3)).sum().backward()
            opt.step()
        out[name] = opt
    hooked = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    hooked.register_state_dict_post_hook(lambda o, sd: {**sd, "note": 1})
    out["post hook"] = hooked
    return out


def _schedulers():
    def opt():
        return torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1, momentum=0.9)

    made = {
        "step": lambda: torch.optim.lr_scheduler.StepLR(opt(), 3),
        "one cycle": lambda: torch.optim.lr_scheduler.OneCycleLR(opt(), max_lr=0.1, total_steps=10),
        "plateau": lambda: torch.optim.lr_scheduler.ReduceLROnPlateau(opt()),
        "cyclic": lambda: torch.optim.lr_scheduler.CyclicLR(opt(), 0.01, 0.1),
        "lambda": lambda: torch.optim.lr_scheduler.LambdaLR(opt(), lambda e: 0.9 ** e),
        "warm restarts": lambda: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt(), 4),
    }
    out = {}
    for name, make in made.items():
        sched = make()
        sched.optimizer.step()
        sched.step(1.0) if name == "plateau" else sched.step()
        out[name] = sched
    return out


@pytest.mark.parametrize("name", sorted(_modules()) + [f"opt:{n}" for n in _optimizers()]
                         + [f"sched:{n}" for n in _schedulers()])
def test_the_in_place_walk_finds_what_the_walk_over_state_dict_finds(name):
    """The fast walk reads a module's parameters and buffers, an optimizer's state and groups and
    a scheduler's attributes in place rather than through state_dict(): the same structure, plain
    values and tensors (the same memory, in the same order), hooks, an instance's own
    state_dict, extra state, None entries and non-persistent buffers included."""
    from flor.state import cache as cache_module

    kind, _, key = name.rpartition(":")
    obj = {"": _modules, "opt": _optimizers, "sched": _schedulers}[kind]()[key]
    direct, through_state_dict = _walks(obj)
    assert direct == through_state_dict
    walk = {"": cache_module._module, "opt": cache_module._optimizer, "sched": cache_module._scheduler}[kind]
    in_place = walk(obj, [], [], []) if kind == "" else walk(obj, [], [], [], 0, True)
    plain = key not in ("post hook", "pre hook", "own state_dict", "extra state", "cyclic", "lambda")
    assert (in_place is not None) is plain  # torch's own state_dict: walked in place; else through it
    assert direct[0] or key == "extra state"


def test_a_walk_that_disagrees_with_state_dict_is_not_used(monkeypatch):
    """Should the in-place walk ever see a module otherwise than its state_dict() does, the
    block's snapshots walk state_dict() (and are still the full encoding)."""
    from flor.state import cache as cache_module

    real = cache_module._module

    def swapped(m, sig, vals, tensors):  # the first two tensors in the wrong order
        done = real(m, sig, vals, tensors)
        tensors[0], tensors[1] = tensors[1], tensors[0]
        return done

    net, opt, sched, scaler = make_training()
    train_steps(net, opt, sched, n=2)
    monkeypatch.setattr(cache_module, "_module", swapped)
    cache = TreeCache()
    snapshot([net, opt, sched], cache=cache).release()
    assert not cache.direct and not cache.off
    train_steps(net, opt, sched, n=2)
    fast = snapshot([net, opt, sched], cache=cache)
    assert fast.build is not None and materialized(fast)[0] == full([net, opt, sched])


def test_the_snapshot_that_learns_is_the_walks_copies_under_the_full_encodings_tree():
    """A block's first snapshot used to be the full encoding with copies, then the walk twice and
    the template check (~5 ms for the digits CNN, where the 1% budget allows ~2 ms an epoch).
    Now it is the fast walk's copies, checked against the full encoding without copies: no
    pooled buffer is taken, the copies are the block's first buffer set, its tree and bytes
    are the full encoding's, and they hold end()-time values while training goes on."""
    from flor.state import BufferPool

    net, opt, sched, scaler = make_training()
    train_steps(net, opt, sched, n=2)
    objs = [net, opt, sched, scaler, 7, 0.5, "tag", [1, 2.5, None], {3: 0.25, 4: 0.5}, np.arange(6.0)]
    pool, cache = BufferPool(), TreeCache()
    expected_tree, expected_blobs = materialized(snapshot(objs, copy=False))
    first = snapshot(objs, pool=pool, cache=cache)
    assert first.build is None and first.buffers == [] and pool.nbytes == 0, "no encoder copies, no pool"
    assert cache.sig is not None and cache.sets == 1 and not cache.off and cache.direct
    assert [t.data_ptr() for _, t in first.tensors] == [t.data_ptr() for t in first.buffer_set]
    train_steps(net, opt, sched, n=1)  # training goes on before the writer gets to it
    objs[9] += 1
    tree, blobs = materialized(first)
    assert tree == expected_tree and blobs == expected_blobs
    assert cache._free, "its buffers are the block's first set, reused"
    again = snapshot(objs, cache=cache)
    assert again.build is not None and materialized(again)[0] == full(objs)


def test_a_walk_whose_dict_keys_differ_is_caught_even_where_the_values_agree(monkeypatch):
    """Two of a group's flags (both False) in the other order: the values, tensors and number of
    entries agree with the full encoding, but a later checkpoint would write one flag's value
    under the other's name. The keys are compared too: the block walks state_dict() instead."""
    from flor.state import cache as cache_module

    real = cache_module._optimizer

    def swapped(opt, sig, vals, tensors, depth, direct):
        done = real(opt, sig, vals, tensors, depth, direct)
        for i, entry in enumerate(sig):
            if type(entry) is tuple and len(entry) == 4 and entry[0] is dict and "maximize" in entry[1]:
                names = list(entry[1])
                a, b = names.index("maximize"), names.index("capturable")
                names[a], names[b] = names[b], names[a]
                sig[i] = (dict, tuple(names), entry[2], entry[3])
        return done

    net, opt, sched, _ = make_training()
    train_steps(net, opt, sched, n=1)
    assert opt.param_groups[0]["maximize"] is opt.param_groups[0]["capturable"] is False
    monkeypatch.setattr(cache_module, "_optimizer", swapped)
    cache = TreeCache()
    first = snapshot([net, opt, sched], cache=cache)
    assert not cache.direct and not cache.off, "the in-place walk is not used"
    assert materialized(first)[0] == full([net, opt, sched])
    train_steps(net, opt, sched, n=1)
    opt.param_groups[0]["capturable"] = True  # (only a value to write: no step follows)
    later = snapshot([net, opt, sched], cache=cache)
    assert later.build is not None and materialized(later)[0] == full([net, opt, sched])


def test_a_walk_whose_values_differ_from_the_encodings_is_not_used(monkeypatch):
    """A walk that reads a value otherwise than state_dict() does (here: the scheduler's first
    int, its ``total_steps``, off by one) is caught by the value check at the first snapshot:
    the block walks state_dict(), and every checkpoint is the full encoding's tree."""
    from flor.state import cache as cache_module

    real = cache_module._scheduler

    def off_by_one(obj, sig, vals, tensors, depth, direct):
        n = len(vals)
        done = real(obj, sig, vals, tensors, depth, direct)
        for i in range(n, len(vals)):
            if type(vals[i]) is int and not isinstance(vals[i], bool):
                vals[i] += 1
                break
        return done

    net, opt, sched, _ = make_training()
    train_steps(net, opt, sched, n=2)
    monkeypatch.setattr(cache_module, "_scheduler", off_by_one)
    cache = TreeCache()
    first = snapshot([net, opt, sched], cache=cache)
    assert not cache.direct and not cache.off
    assert materialized(first)[0] == full([net, opt, sched])
    train_steps(net, opt, sched, n=1)
    later = snapshot([net, opt, sched], cache=cache)
    assert later.build is not None and materialized(later)[0] == full([net, opt, sched])


def test_a_templates_values_rebuild_it():
    """``_values`` lists a tree's plain values in the order ``_build`` takes them (the first
    snapshot compares them with the walk's): every kind of node the fast path knows."""
    from flor.state.cache import _build, _values

    net, opt, sched, scaler = make_training()
    train_steps(net, opt, sched, n=1)
    objs = [net, opt, sched, scaler, random.Random(3), np.random.default_rng(1), np.random.RandomState(2),
            torch.Generator().manual_seed(4), np.float32(0.5), collections.deque([1.0, 2.0], maxlen=3),
            {0: 0.5, 1: None}, [(1, 0.5), [2, "a"]], {"nested": [{"a": 1}, (True, -0.0)], "nan": float("nan")},
            np.zeros((2, 3), dtype=np.int16)]
    tree = snapshot(objs, copy=False).tree  # (its tensor nodes without hashes, as ``_build`` makes them)
    found: list = []
    _values(tree, found)
    assert found and canonical_json(_build(tree, iter(found), [])) == canonical_json(tree)


def test_non_finite_values_take_the_fast_path_and_are_written_as_the_full_encoding_writes_them():
    """ReduceLROnPlateau keeps ``best`` and ``mode_worse`` at infinity; a loss may be NaN. They
    used to keep a block on the full encoding for the whole run; the fast path writes them as
    the full encoding does (canonical JSON's NaN and Infinity), checked as text."""
    net = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    stats = {"loss": float("nan"), "low": -float("inf"), "zero": -0.0}
    cache = TreeCache()
    fast = []
    for loss in (float("nan"), 2.0, float("inf"), 1.0):
        net(torch.randn(2, 3)).sum().backward()
        opt.step()
        sched.step(loss)
        stats["loss"] = loss
        p = snapshot([net, opt, sched, stats], cache=cache)
        fast.append(p.build is not None)
        tree, _ = materialized(p)
        assert json.dumps(tree, sort_keys=True) == json.dumps(full([net, opt, sched, stats]), sort_keys=True)
        assert "Infinity" in json.dumps(tree) and "-0.0" in json.dumps(tree)
        p.release()
    assert fast == [False, True, True, True], "the fast path, every time after the first"


def test_histories_that_grow_every_epoch_keep_the_fast_path():
    """A loss history, ``(epoch, accuracy)`` pairs, a list with np.float64 in it, a dict
    keyed by epoch and a ``deque(maxlen=3)``: every append used to change the block's signature, so every checkpoint was
    a full encoding and a new template. They are one value each now: the fast path every time
    after the first, its rendered text and built tree the full encoding's, and a restore gives
    them back; a list that takes a tensor learns again."""
    net = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    losses: list = []
    pairs: list = []
    mixed: list = []
    by_epoch: dict = {}
    recent = collections.deque(maxlen=3)  # the last three losses: a moving average's window
    cache = TreeCache()
    fast = []
    for epoch in range(6):
        net(torch.randn(2, 3)).sum().backward()
        opt.step()
        losses.append(0.5 / (epoch + 1))
        pairs.append((epoch, 1.0 - losses[-1]) if epoch % 2 else [epoch, None, "x"])
        mixed.append(np.float64(epoch / 3))
        by_epoch[epoch] = np.float64(epoch / 4) if epoch % 2 else None
        recent.append(losses[-1])
        if epoch == 4:
            losses.append(float("nan"))
        if epoch == 5:
            mixed.append(torch.ones(1))  # no longer plain values: walked element by element
        objs = [net, opt, losses, tuple(pairs), {"mixed": mixed}, [], by_epoch, recent]
        took, tree, blobs = fast_as_full(objs, cache)
        fast.append(took)
    assert fast == [False, True, True, True, True, False], "the fast path until the list took a tensor"
    window = collections.deque(maxlen=3)
    restored = restore([torch.nn.Linear(3, 2), torch.optim.Adam(torch.nn.Linear(3, 2).parameters()), [], (), {}, [],
                        {}, window], tree, blobs.__getitem__)
    assert restored[6] == {e: (e / 4 if e % 2 else None) for e in range(6)}
    assert restored[7] is window and list(window) == list(recent) == [0.5 / 4, 0.5 / 5, 0.5 / 6]
    nan = [i for i, x in enumerate(losses) if x != x]
    assert nan == [5] and [x for x in restored[2] if x == x] == [x for x in losses if x == x] \
        and restored[2][5] != restored[2][5]
    assert list(restored[3]) == [tuple(x) if type(x) is tuple else x for x in pairs]
    assert restored[4]["mixed"][:-1] == [float(x) for x in mixed[:-1]] and type(restored[4]["mixed"][0]) is float


def test_a_scripts_own_generators_take_the_fast_path_and_restore_their_draws():
    """A ``random.Random`` and NumPy's ``default_rng`` (PCG64, PCG64DXSM) given to ``end()``
    (an augmentation's own generator) are walked as the full encoding writes them; MT19937's
    and the legacy RandomState's states hold arrays and keep the block on the full encoding.
    A restore gives the same draws as the live generators."""
    net = torch.nn.Linear(3, 2)
    gens = [random.Random(1), np.random.default_rng(2), np.random.Generator(np.random.PCG64DXSM(3))]
    cache = TreeCache()
    fast = []
    for _ in range(3):
        gens[0].random(), gens[1].random(), gens[2].integers(10)
        took, tree, blobs = fast_as_full([net, *gens], cache)
        fast.append(took)
    assert fast == [False, True, True]
    fresh = [random.Random(9), np.random.default_rng(9), np.random.Generator(np.random.PCG64DXSM(9))]
    restore([torch.nn.Linear(3, 2), *fresh], tree, blobs.__getitem__)
    assert fresh[0].random() == gens[0].random() and fresh[1].random() == gens[1].random()
    assert fresh[2].integers(1 << 40) == gens[2].integers(1 << 40)
    gens = [np.random.RandomState(4), np.random.Generator(np.random.MT19937(5))]  # their states hold an array
    cache = TreeCache()
    fast = []
    for _ in range(3):
        gens[0].rand(), gens[1].random()
        took, tree, blobs = fast_as_full([net, *gens], cache)
        fast.append(took)
    assert fast == [False, True, True]
    fresh = [np.random.RandomState(9), np.random.Generator(np.random.MT19937(9))]
    restore([torch.nn.Linear(3, 2), *fresh], tree, blobs.__getitem__)
    assert fresh[0].rand() == gens[0].rand() and fresh[1].random() == gens[1].random()


class _TrainState:  # a script's own state object: no state_dict, its attributes
    def __init__(self):
        self.best, self.bad, self.history, self.ema = float("inf"), 0, [], torch.zeros(4)


@dataclasses.dataclass
class _Stats:
    best: float = 0.0
    patience: int = 3
    seen: list = dataclasses.field(default_factory=list)


def test_plain_objects_and_dataclasses_take_the_fast_path_and_restore_in_place():
    """A state object of the script's own (its attributes), a dataclass (its fields, and an
    attribute set later) and a SimpleNamespace: walked as the full encoding writes them
    (the "object" and "dataclass" nodes), restored in place."""
    net = torch.nn.Linear(3, 2)
    state, stats, ns = _TrainState(), _Stats(), types.SimpleNamespace(step=0, tag="a")
    stats.note = "later"
    cache = TreeCache()
    fast = []
    for epoch in range(4):
        state.best, state.bad = min(state.best, 1.0 / (epoch + 1)), epoch % 2
        state.history.append(state.best)
        state.ema.mul_(0.5).add_(epoch)
        stats.seen.append((epoch, epoch * 0.5))
        ns.step += 10
        objs = [net, state, stats, ns]
        took, tree, blobs = fast_as_full(objs, cache)
        fast.append(took)
    assert fast == [False, True, True, True]
    live = [torch.nn.Linear(3, 2), _TrainState(), _Stats(), types.SimpleNamespace()]
    back = restore(live, tree, blobs.__getitem__)
    assert back[1] is live[1] and back[1].history == state.history and torch.equal(back[1].ema, state.ema)
    assert back[2].seen == stats.seen and back[2].note == "later" and back[3].step == 40 and back[3].tag == "a"


def test_numpy_arrays_take_the_fast_path_and_are_the_full_encoding():
    """A running confusion matrix, a 0-d array, a bool mask: copied like tensors on the fast
    path, written as the full encoding writes them; a strided view, a read-only array, an
    array of strings and an empty one keep the block on the full encoding, still exact."""
    net = torch.nn.Linear(3, 2)
    confusion, best, mask = np.zeros((4, 4), dtype=np.int64), np.array(0.5), np.zeros(5, dtype=bool)
    cache = TreeCache()
    fast = []
    for epoch in range(4):
        confusion[epoch % 4, (epoch + 1) % 4] += 3
        best += 0.125
        mask[epoch] = True
        objs = [net, {"confusion": confusion, "best": best}, mask]
        took, tree, blobs = fast_as_full(objs, cache)
        fast.append(took)
        confusion += 1  # after the snapshot: not in it
    assert fast == [False, True, True, True]
    back = restore([torch.nn.Linear(3, 2), {}, np.ones(5, dtype=bool)], tree, blobs.__getitem__)
    assert np.array_equal(back[1]["confusion"], confusion - 1) and back[1]["best"] == 1.0 and back[1]["best"].shape == ()
    assert back[2].tolist() == [True] * 4 + [False]
    readonly = np.arange(3.0)
    readonly.flags.writeable = False
    for other in (np.arange(10)[::2], readonly, np.array(["a", "b"]), np.zeros((0, 3))):
        cache = TreeCache()
        taken = []
        for _ in range(2):
            p = snapshot([net, other], cache=cache)
            taken.append(p.build is not None)
            tree, blobs = materialized(p)
            assert np.array_equal(restore([torch.nn.Linear(3, 2), None], tree, blobs.__getitem__)[1], other)
        assert taken == [False, False], other


def test_numpy_scalars_take_the_fast_path_and_are_the_full_encoding():
    """A best accuracy from scikit-learn (np.float64), a step from a NumPy op (np.int64), a
    float32 metric, a NumPy bool: the fast path takes them, writes what the full encoding
    writes, and a scalar whose type changes makes the block learn again."""
    net = torch.nn.Linear(3, 2)
    cache = TreeCache()
    fast = []
    for i, step_type in enumerate((np.int64, np.int64, np.int64, np.int32, np.int32)):
        stats = {"best": np.float64(0.5 + i), "step": step_type(10 * i), "metric": np.float32(i / 3),
                 "stop": np.bool_(i % 2), "u": np.uint8(i), "h": np.float16(i / 4)}
        p = snapshot([net, stats], cache=cache)
        fast.append(p.build is not None)
        assert json.dumps(materialized(p)[0], sort_keys=True) == json.dumps(full([net, stats]), sort_keys=True)
        p.release()
    assert fast == [False, True, True, False, True]  # np.int32 where np.int64 was: learned again


class _EarlyStopping:  # a script's own helper: state_dict and load_state_dict, no torch base class
    def __init__(self):
        self.best, self.bad, self.history = float("inf"), 0, []

    def state_dict(self):
        return {"best": self.best, "bad": self.bad, "history": list(self.history)}

    def load_state_dict(self, state):
        self.best, self.bad, self.history = state["best"], state["bad"], list(state["history"])


class _Ema:
    def __init__(self, net):
        self.shadow = {k: v.detach().clone() for k, v in net.state_dict().items()}

    def state_dict(self):
        return {"shadow": self.shadow, "decay": 0.9}

    def load_state_dict(self, state):
        self.shadow = state["shadow"]


def test_a_scripts_own_stateful_helpers_take_the_fast_path_and_are_the_full_encoding():
    """Any class with state_dict and load_state_dict (an early-stopping helper, an EMA of the
    weights), not only torch's: the fast path walks its state_dict() as the full encoding does."""
    net = torch.nn.Linear(3, 2)
    stop, ema = _EarlyStopping(), _Ema(net)
    cache = TreeCache()
    fast = []
    for loss in (3.0, 2.0, 2.5, 1.5):
        stop.history = (stop.history + [loss])[-2:]  # the last two
        stop.best, stop.bad = min(stop.best, loss), stop.bad + (loss > stop.best)
        for k, v in net.state_dict().items():
            ema.shadow[k].mul_(0.9).add_(v, alpha=0.1)
        p = snapshot([net, stop, ema], cache=cache)
        fast.append(p.build is not None)
        tree, blobs = materialized(p)
        assert json.dumps(tree, sort_keys=True) == json.dumps(full([net, stop, ema]), sort_keys=True)
        p.release()
    assert fast == [False, True, True, True]  # the history grew at the second: one value, kept the template
    stop2, ema2 = _EarlyStopping(), _Ema(torch.nn.Linear(3, 2))
    restore([torch.nn.Linear(3, 2), stop2, ema2], tree, blobs.__getitem__)
    assert stop2.state_dict() == stop.state_dict()
    assert all(torch.equal(ema2.shadow[k], ema.shadow[k]) for k in ema.shadow)


def test_a_generator_passed_to_end_takes_the_fast_path_and_restores():
    """A DataLoader's own torch.Generator passed to end() (docs/replay.md lists generators): its
    state, a new tensor each read, is copied like any tensor, and the module beside it is still
    walked in place (the two-walk check compares a generator's state by its bytes)."""
    net = torch.nn.Linear(3, 2)
    g = torch.Generator().manual_seed(7)
    lone = torch.nn.Parameter(torch.ones(2))  # a parameter passed by itself
    cache = TreeCache()
    fast = []
    for _ in range(3):
        torch.randperm(10, generator=g)
        p = snapshot([net, g, lone], cache=cache)
        fast.append(p.build is not None)
        expected = torch.randperm(10, generator=g.clone_state() if hasattr(g, "clone_state") else g)
        tree, blobs = materialized(p)
        assert json.dumps(tree, sort_keys=True) == json.dumps(full([net, g, lone]), sort_keys=True)
        p.release()
    assert fast == [False, True, True] and cache.direct
    g2 = torch.Generator()
    restore([torch.nn.Linear(3, 2), g2, torch.nn.Parameter(torch.zeros(2))], tree, blobs.__getitem__)
    assert torch.equal(torch.randperm(10, generator=g2), expected)


def test_a_numpy_float_in_end_compares_equal_after_the_manifest_round_trip():
    """A replay compares its state with the recorded manifest (read back from JSON), types
    exactly. An np.float64 (a float subclass) or np.str_ was kept as itself in the tree and read
    back as a float or str, so every probed replay of a script passing one to end() said
    DIVERGED; the encoder now writes their base type."""
    objs = [np.float64(0.25), np.str_("tag"), np.float64("inf"), {"best": np.float64(-0.0)}]
    recorded = full(objs)  # through JSON, as a manifest is read
    now = snapshot(objs, copy=False).materialize()
    assert diff_nodes(recorded, now) == []
    lin, cache, fast = torch.nn.Linear(2, 2), TreeCache(), []
    floats = [lin, np.float64(0.25), np.float64("inf"), {"best": np.float64(-0.0)}]
    for _ in range(2):  # and the fast path writes the same
        p = snapshot(floats, cache=cache)
        fast.append(p.build is not None)
        assert diff_nodes(materialized(p)[0], snapshot(floats, copy=False).materialize()) == []
        p.release()
    assert fast == [False, True]


def test_a_block_without_tensors_takes_the_fast_path_too():
    stats = {"seen": 0, "norm": 1.5}
    cache = TreeCache()
    for seen in range(3):
        stats["seen"] = seen
        p = snapshot([stats], cache=cache)
        cache.top_up()
        assert materialized(p)[0] == full([stats])
        p.release()
    assert not cache.off and cache.sets <= 1


def test_frozen_parameters_are_in_the_tree_and_follow_requires_grad():
    """A module's parameters that do not require grad are its node's "frozen", on the fast path
    as in the full encoding, and an unfreeze between checkpoints (the template kept) is seen;
    restoring puts requires_grad back, which state_dict's detached tensors do not carry."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    net[0].weight.requires_grad_(False)
    cache = TreeCache()
    snapshot([net], cache=cache).release()
    assert not cache.off
    took, tree, blobs = fast_as_full([net], cache)
    assert took and tree["v"][0]["frozen"] == ["0.weight"]
    net[0].weight.requires_grad_(True)
    net[1].bias.requires_grad_(False)
    took, tree, blobs = fast_as_full([net], cache)
    assert took and tree["v"][0]["frozen"] == ["1.bias"]
    check_node(tree)  # a manifest may hold it
    other = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    restore([other], tree, blobs.__getitem__)
    assert [p.requires_grad for p in other.parameters()] == [True, True, True, False]
    assert diff_nodes(tree, full([net])) == []
    net[0].bias.requires_grad_(False)
    assert diff_nodes(tree, full([net])) == ["[0].<requires_grad>"]
