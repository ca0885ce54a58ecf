"""flor.watch.reachable: what a block uses but ``end()`` was not given (a scheduler, a scaler, a
random generator it drew from) is found in the frame, and the advice never raises.
"""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

from flor.watch import reachable as objects


def _training_objects():
    net = torch.nn.Linear(3, 1)
    opt = torch.optim.AdamW(net.parameters(), lr=0.1)
    return net, opt


def test_the_check_reads_the_locals_of_a_loop_in_a_function():
    def main() -> None:
        net, opt = _training_objects()
        warmup = torch.optim.lr_scheduler.LinearLR(opt)  # noqa: F841 - found by name in this frame
        scaler = torch.amp.GradScaler("cpu")  # noqa: F841
        objects.warn_forgotten("train", (net, opt))
        del warmup, scaler  # used: warn_forgotten found them in this frame by name

    with pytest.warns(RuntimeWarning) as caught:
        main()
    said = sorted(str(w.message) for w in caught)
    assert len(said) == 2
    assert "`scaler` (a torch.amp.grad_scaler.GradScaler" in said[0]
    assert "`warmup` (a torch.optim.lr_scheduler.LinearLR, the LR scheduler of the optimizer" in said[1]


@pytest.mark.parametrize("case, expected", [
    ("scheduler of another optimizer", []),
    ("no optimizer given", []),
    ("scheduler inside a list given", []),
    ("disabled scaler", []),
    ("forgotten scheduler", ["sched"]),
])
def test_what_counts_as_forgotten(case, expected):
    net, opt = _training_objects()
    other = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    variables = {"net": net, "opt": opt, "epochs": 3, "name": "x"}
    given: tuple = (net, opt)
    if case == "scheduler of another optimizer":
        variables["sched"] = torch.optim.lr_scheduler.StepLR(other, 1)
    elif case == "no optimizer given":
        variables["sched"] = torch.optim.lr_scheduler.StepLR(opt, 1)
        given = (net,)
    elif case == "scheduler inside a list given":
        variables["sched"] = torch.optim.lr_scheduler.StepLR(opt, 1)
        given = (net, [opt, variables["sched"]])
    elif case == "disabled scaler":
        variables["scaler"] = torch.amp.GradScaler("cpu", enabled=False)
    else:
        variables["sched"] = torch.optim.lr_scheduler.StepLR(opt, 1)
    assert [name for name, _, _ in objects.forgotten(given, variables)] == expected


def test_the_generator_advice_never_raises_even_under_w_error():
    g = torch.Generator().manual_seed(0)
    watched = objects.watch_generators(sys._getframe())
    assert [name for name, _, _ in watched] == ["g"]
    torch.randperm(8, generator=g)
    assert objects.drawn_generators(watched, (g,)) == []  # given: nothing to say
    drawn = objects.drawn_generators(watched, (torch.nn.Linear(2, 1),))
    assert [name for name, _, _ in drawn] == ["g"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        objects.warn_generators("train", drawn)  # warns, as an exception: swallowed
    with pytest.warns(RuntimeWarning, match="was not given `g`"):
        objects.warn_generators("train", drawn)
    g.manual_seed(1)  # reseeded before the block's next entry: a replay reseeds it too
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        objects.warn_generators("train", drawn)
