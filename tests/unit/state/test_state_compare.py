"""flor.state.compare: the leaves two snapshots differ in, named by their path."""

from __future__ import annotations

import torch

from flor.state import diff_nodes, snapshot

from helpers import make_training


def test_diff_names_changed_leaves():
    net, opt, sched, _ = make_training()
    a = snapshot([net, 3], copy=False).materialize()
    with torch.no_grad():
        net[3].bias += 1
    b = snapshot([net, 4], copy=False).materialize()
    assert diff_nodes(a, b) == ["[0].3.bias", "[1]"]
    assert diff_nodes(a, a) == []
