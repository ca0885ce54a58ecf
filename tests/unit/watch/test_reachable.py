"""flor.watch.reachable: what a block uses but ``end()`` was not given (a scheduler, a scaler, a
random generator it drew from) is found in the frame by its probes, and a probe never raises into
the script.
"""

from __future__ import annotations

import sys

import pytest
import torch

from flor.watch import reachable as objects
from flor.watch.probe import Watch
from flor.watch.reachable import GeneratorProbe, SchedulerProbe


def _training_objects():
    net = torch.nn.Linear(3, 1)
    opt = torch.optim.AdamW(net.parameters(), lr=0.1)
    return net, opt


def _watch(*probes):
    """A Watch over ``probes`` whose findings go to a list: ``(code, text)``."""
    said: list[tuple[str, str]] = []
    return Watch(probes, lambda code, subject, text: said.append((code, text))), said


def test_the_check_reads_the_locals_of_a_loop_in_a_function():
    def main() -> list[tuple[str, str]]:
        net, opt = _training_objects()
        warmup = torch.optim.lr_scheduler.LinearLR(opt)  # noqa: F841 - found by name in this frame
        scaler = torch.amp.GradScaler("cpu")  # noqa: F841
        watch, said = _watch(SchedulerProbe())
        watch.enter("train", 0, 0, sys._getframe())
        watch.leave(sys._getframe(), (net, opt))
        del warmup, scaler  # used: the probe found them in this frame by name
        return said

    said = sorted(main())
    assert [code for code, _ in said] == ["FL201", "FL201"]
    assert "`scaler` (a torch.amp.grad_scaler.GradScaler" in said[0][1]
    assert "`warmup` (a torch.optim.lr_scheduler.LinearLR, the LR scheduler of the optimizer" in said[1][1]


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


def test_a_drawn_generator_is_named_at_the_blocks_next_entry_unless_given_or_reseeded():
    g = torch.Generator().manual_seed(0)
    watched = objects.watch_generators(sys._getframe().f_locals)
    assert [name for name, _, _ in watched] == ["g"]
    frame = sys._getframe()
    watch, said = _watch(GeneratorProbe())
    watch.enter("given", 0, 0, frame)
    torch.randperm(8, generator=g)
    watch.leave(frame, (g,))  # given: nothing to say
    watch.enter("given", 1, 0, frame)
    watch.enter("drawn", 0, 0, frame)
    torch.randperm(8, generator=g)
    watch.leave(frame, (torch.nn.Linear(2, 1),))
    assert said == []  # named at a block's second entry only
    watch.enter("drawn", 1, 0, frame)  # still where its first run left it: named
    assert [code for code, _ in said] == ["FL202"] and "was not given `g`" in said[0][1]
    watch.leave(frame, ())
    watch.enter("reseeded", 0, 0, frame)
    torch.randperm(8, generator=g)
    watch.leave(frame, (torch.nn.Linear(2, 1),))
    g.manual_seed(1)  # reseeded before the block's next entry: a replay reseeds it too
    watch.enter("reseeded", 1, 0, frame)
    assert len(said) == 1


def test_a_probe_that_raises_never_reaches_the_script():
    def say(code, subject, text):
        raise RuntimeWarning(text)  # as warnings.warn does under -W error

    g = torch.Generator().manual_seed(0)
    frame = sys._getframe()
    watch = Watch([GeneratorProbe(), SchedulerProbe()], say)
    watch.enter("train", 0, 0, frame)
    torch.randperm(8, generator=g)
    net, opt = _training_objects()
    sched = torch.optim.lr_scheduler.LinearLR(opt)  # noqa: F841 - found by name: said, and the say raises
    watch.leave(frame, (net, opt))
    watch.enter("train", 1, 0, frame)
    assert set(watch.failed) == {"SchedulerProbe", "GeneratorProbe"}  # each swallowed where it was said

