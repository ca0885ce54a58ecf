"""A module's state beyond its state_dict (flor.state.nodes): the train/eval mode of its
submodules, its non-persistent buffers and tensor attributes are captured and restored as
recorded; names read from a store set only what the module has (``e2e/test_module_mode.py``
and ``e2e/test_module_tensors.py`` replay real scripts).
"""

from __future__ import annotations

import json

import pytest
import torch

from flor.errors import CheckpointError
from flor.state import diff_nodes, restore, snapshot
from flor.store.manifest import check_node


def _tree(net):
    pending = snapshot(net, copy=False)
    blobs = {}
    for node, data in pending.leaves():
        node["h"] = f"{len(blobs):064x}"
        blobs[node["h"]] = bytes(data)
    return json.loads(json.dumps(pending.tree)), blobs


def test_the_mode_round_trips_and_verification_compares_it():
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2), torch.nn.Dropout())
    net[1].eval()
    tree, blobs = _tree(net)
    assert tree["eval"] == ["1"]
    other = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2), torch.nn.Dropout()).eval()
    restore(other, tree, blobs.__getitem__)
    assert [m.training for m in other.modules()] == [True, True, False, True]
    assert diff_nodes(tree, _tree(net.eval())[0]) == ["<training>"]


def test_a_hostile_eval_list_is_refused_or_names_no_module():
    net = torch.nn.Sequential(torch.nn.Linear(2, 2))
    tree, blobs = _tree(net)
    for bad in ("0", {"x": 1}, [1], ["\x00"]):
        damaged = dict(tree, eval=bad)
        with pytest.raises(Exception, match="eval mode"):
            check_node(damaged)
    # names of no submodule set nothing: every module is in training mode as recorded otherwise
    restore(net.eval(), dict(tree, eval=["__class__", "0.weight", "../x"]), blobs.__getitem__)
    assert all(m.training for m in net.modules())


def test_a_hostile_tree_sets_only_the_module_tensors_the_module_has():
    """The names come from a store: through submodules only, to a non-persistent buffer or a
    tensor attribute the module has now; never a parameter, a method, a dunder or a new name."""
    net = torch.nn.Sequential(torch.nn.Linear(2, 2))
    net[0].register_buffer("seen", torch.zeros(()), persistent=False)
    net[0].scale = torch.ones(2)
    pending = snapshot(net, copy=False)
    blobs = {}
    for node, data in pending.leaves():
        node["h"] = str(len(blobs))
        blobs[node["h"]] = bytes(data)
    tree = pending.tree
    assert tree["aux"]["k"] == ["0.seen", "0.scale"]
    weight = net[0].weight.detach().clone()
    seven = tree["aux"]["v"][0]  # a 0-d float tensor's node, holding 7
    blobs[seven["h"]] = torch.tensor(7.0).numpy().tobytes()
    names = ["0.weight", "0.forward", "0.__class__", "0.new", "1.seen", "0.training.x", "..seen", "0.seen"]
    tree["aux"] = {"t": "dict", "k": names, "v": [seven] * len(names)}
    before = set(vars(net[0]))
    restore(net, tree, blobs.__getitem__)
    assert net[0].seen.item() == 7.0 and torch.equal(net[0].weight, weight) and set(vars(net[0])) == before
    assert callable(net[0].forward) and type(net[0]) is torch.nn.Linear
    tree["aux"] = {"t": "dict", "k": ["0.seen"], "v": [{"t": "pickle", "h": "0"}]}
    with pytest.raises(CheckpointError):
        restore(net, tree, blobs.__getitem__)
