"""A module's tensors outside its state_dict are checkpointed and restored with it
(``scripts/module_tensors.py``).

A module was checkpointed through its state_dict alone, which holds neither its
non-persistent buffers (``register_buffer(..., persistent=False)``) nor tensors kept as plain
attributes, such as the ``weight`` that the legacy ``torch.nn.utils.weight_norm`` and
``spectral_norm`` compute before each forward. A replay that restored the block read them as
they were before it (a sample count of 0, the weight of another epoch) and said "verified exact".
A tensor attribute is put back in place, unless it shares a parameter's memory (the legacy
spectral_norm's ``weight`` before the first forward), which writing through would change.
"""

from __future__ import annotations

import pytest
import torch

from conftest import Runner, record_and_full_run
from flor.errors import CheckpointError
from flor.state import restore, snapshot

HINDSIGHT = {"    # HINDSIGHT": '    flor.log("seen", net.seen.item())\n'
                                '    flor.log("mean_in", net.mean_in.sum().item())\n'
                                '    flor.log("last_mean", net.last_mean.item())\n'
                                '    flor.log("out_weight", net.out.weight.norm().item())\n'
                                '    flor.log("hidden_weight", net.hidden.weight.norm().item())'}
NAMES = {"loss", "seen", "mean_in", "last_mean", "out_weight", "hidden_weight"}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A recording with a checkpoint every 2nd epoch, and the full run of the edited script."""
    r = Runner(tmp_path_factory.mktemp("module_tensors"))
    edited, full = record_and_full_run(r, "module_tensors.py", HINDSIGHT, NAMES)
    assert len(full) == 6 * len(NAMES)
    assert [full[("seen", e, None)] for e in range(6)] == [64, 128, 192, 256, 320, 384]
    return r, edited, full


@pytest.mark.parametrize("workers", [1, 3])
def test_a_restored_module_has_its_non_persistent_buffers_and_tensor_attributes(recorded, workers):
    r, edited, full = recorded
    got = r.replay_workers(edited, "r", workers, NAMES)
    assert got == full


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
