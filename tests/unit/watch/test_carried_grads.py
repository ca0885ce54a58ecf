"""flor.watch.grads: the hook that notices gradients carried into a block's next run is removed
and never raises.
"""

from __future__ import annotations

import warnings

import torch

from flor.watch import grads as _grads


def test_the_gradient_hook_is_removed_and_never_raises():
    p = torch.nn.Parameter(torch.ones(3))
    (p * 2).sum().backward()  # a leftover gradient
    carried = _grads.CarriedGrad("train", p)
    (p * 3).sum().backward()
    (p * 3).sum().backward()  # later backward passes: looked at once
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert carried.close() is True  # warns, as an exception: swallowed
    assert not p._backward_hooks and carried.close() is False
    p.grad = None  # zero_grad(set_to_none=True) before the block's first backward
    p.grad = torch.ones(3)
    carried = _grads.CarriedGrad("train", p)
    p.grad.zero_()  # zero_grad(set_to_none=False)
    (p * 3).sum().backward()
    assert carried.close() is False and not p._backward_hooks
    p.grad = None
    assert _grads.CarriedGrad("train", p).handle is None  # nothing left over: nothing to watch
