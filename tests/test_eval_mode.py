"""A module's train/eval mode is checkpointed and restored with it (``scripts/eval_mode.py``).

A module was captured through its ``state_dict``, which does not hold ``training``. A block that
left its model in eval mode (validation inside the block) and a replay that restored it left the
model in the mode it had before: hindsight code after ``end()`` that evaluated it drew dropout
masks where a full run does not (a loss of 2.2 against 1.1), and said "verified exact". A
module's node now keeps the names of its submodules in eval mode, and a restore sets each one's
mode as recorded (a frozen BatchNorm inside a model in training mode too).
"""

from __future__ import annotations

import json

import pytest
import torch

from conftest import Runner, record_and_full_run
from flor.state import diff_nodes, restore, snapshot
from flor.store.manifest import check_node

HINDSIGHT = {"    # HINDSIGHT": '    import copy\n'
                                '    with torch.random.fork_rng(), torch.no_grad():  # on a copy: training left alone\n'
                                '        flor.log("after", ((copy.deepcopy(net)(X) - Y) ** 2).mean().item())\n'
                                '    flor.log("training", [net.training, net.bn.training, net.drop.training].count(True))'}
NAMES = {"val", "after", "training"}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A recording with a checkpoint every 2nd epoch, and the full run of the edited script."""
    r = Runner(tmp_path_factory.mktemp("eval_mode"))
    edited, full = record_and_full_run(r, "eval_mode.py", HINDSIGHT, NAMES)
    assert [full[("training", e, None)] for e in range(6)] == [3, 0, 3, 0, 2, 0]
    return r, edited, full


@pytest.mark.parametrize("workers", [1, 3])
def test_a_restored_model_is_in_the_mode_the_block_left_it(recorded, workers):
    r, edited, full = recorded
    got = r.replay_workers(edited, "r", workers, NAMES)
    assert got == full


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
