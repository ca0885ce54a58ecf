"""flor.state.describe: an ``end()`` given other objects than its checkpoint holds is named by
position and type.
"""

from __future__ import annotations

import torch

from flor.state import describe


def test_an_extra_object_is_named_too():
    recorded = [{"t": "stateful", "cls": "torch.nn.modules.linear.Linear"}, 7]
    net = torch.nn.Linear(2, 1)
    text = describe.arity_message("b", 3, recorded, (net, torch.optim.SGD(net.parameters(), lr=0.1), 8))
    assert "was given 3 objects at epoch 3, the recording had 2: position 1 is a torch.optim.sgd.SGD " \
           "(not in the recording)" in text
