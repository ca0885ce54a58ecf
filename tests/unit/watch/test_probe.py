"""flor.watch.probe: the runner of the probes (order, once per (code, subject) is the session's
say, the never-raise wrapper, timing) and each probe's verbs on real frames: a test function's
own frame is the frame a SkipBlock would see."""

from __future__ import annotations

import random
import sys
from typing import Any

import pytest
import torch

from flor.watch.attributes import ModuleAttrProbe
from flor.watch.draws import DrawsProbe
from flor.watch.grads import GradProbe
from flor.watch.names import NamesProbe
from flor.watch.outside import REPLACED, OutsideChanges, OutsideProbe
from flor.watch.probe import Probe, View, Watch
from flor.watch.reachable import ContainerProbe
from flor.watch.variables import VariablesProbe


class Said(list):
    """``say`` that keeps ``(code, subject, text)``."""

    def __call__(self, code: str, subject: Any, text: str) -> None:
        self.append((code, subject, text))

    def codes(self) -> list[str]:
        return [code for code, _, _ in self]


class Recorder(Probe):
    """Notes which verbs ran, in order, with what the view held then."""

    def __init__(self, log: list, name: str) -> None:
        self.log, self.name = log, name

    def enter(self, view: View, say: Any) -> None:
        self.log.append((self.name, "enter", view.block, view.first))

    def leave(self, view: View, say: Any) -> None:
        self.log.append((self.name, "leave", sorted(view.noted)))
        view.noted[self.name] = 1

    def restore(self, view: View, noted: dict, say: Any) -> list[str]:
        self.log.append((self.name, "restore", noted.get("x")))
        return [self.name]


def test_probes_run_in_order_and_see_what_the_earlier_ones_noted() -> None:
    log: list = []
    watch = Watch([Recorder(log, "a"), Recorder(log, "b")], Said())
    frame = sys._getframe()
    assert watch.enter("train", 0, 0, frame) == []
    noted, left = watch.leave(frame, ())
    assert noted == {"a": 1, "b": 1} and left == []
    watch.enter("train", 1, 0, frame)
    watch.leave(frame, (), {"x": 5})  # a replay's restored block: restore, then leave
    assert log == [("a", "enter", "train", True), ("b", "enter", "train", True), ("a", "leave", []),
                   ("b", "leave", ["a"]), ("a", "enter", "train", False), ("b", "enter", "train", False),
                   ("a", "restore", 5), ("b", "restore", 5), ("a", "leave", []), ("b", "leave", ["a"])]


def test_a_probe_that_raises_is_silent_for_that_run_and_the_others_go_on() -> None:
    class Broken(Probe):
        def leave(self, view: View, say: Any) -> None:
            raise ValueError("odd value")

    log: list = []
    watch = Watch([Broken(), Recorder(log, "after")], Said())
    watch.enter("train", 0, 0, sys._getframe())
    noted, _ = watch.leave(sys._getframe(), ())
    assert noted == {"after": 1} and watch.failed == {"Broken": "ValueError('odd value')"}
    assert watch.seconds > 0
    assert set(watch.by_probe) == {"Broken", "Recorder"}  # each probe's own time, a failed one's too
    assert 0 < sum(watch.by_probe.values()) <= watch.seconds


def test_a_recordings_quiet_run_calls_only_the_verbs_its_probes_need_there() -> None:
    """Neither the block's first run nor checkpointed (``note=False``): a probe whose ``quiet`` lacks
    a verb is not called there; a checkpointed run and a replay's call every verb."""
    class Quiet(Recorder):
        quiet = frozenset({"leave"})

    log: list = []
    watch = Watch([Recorder(log, "always"), Quiet(log, "leave only")], Said())
    frame = sys._getframe()
    for epoch, note in ((0, False), (1, False), (2, True)):
        watch.enter("train", epoch, 0, frame, note=note)
        watch.leave(frame, ())
    verbs = [(name, verb) for name, verb, *_ in log]
    assert verbs == [("always", "enter"), ("leave only", "enter"), ("always", "leave"), ("leave only", "leave"),
                     ("always", "enter"), ("always", "leave"), ("leave only", "leave"),  # quiet: no enter
                     ("always", "enter"), ("leave only", "enter"), ("always", "leave"), ("leave only", "leave")]
    replay = Watch([Quiet(log := [], "leave only")], Said(), replay=True)
    for epoch in range(2):
        replay.enter("train", epoch, 0, frame, {})
        replay.leave(frame, ())
    assert [verb for _, verb, *_ in log] == ["enter", "leave", "enter", "leave"]


def _run(watch: Watch, epoch: int, objs: tuple = (), *, note: bool = False, block: str = "train") -> dict:
    """One block run as the recorder drives it: a steady run where the watch takes it, else enter/leave."""
    frame = sys._getframe(1)
    if note or not watch.steady_enter(block, epoch, 0):
        watch.enter(block, epoch, 0, frame, note=note)
    noted = watch.steady_leave(objs)
    if noted is None:
        noted, _ = watch.leave(frame, objs)
    return dict(noted)


def test_a_block_that_ended_twice_has_steady_quiet_runs_with_only_the_verbs_that_act_there() -> None:
    """From a block's third run, a quiet one calls only ``Probe.steady``'s verbs (default: ``quiet``'s),
    timed as one; a checkpointed run, another block's first and a replay's still call every verb."""
    class Settles(Recorder):
        steady: frozenset = frozenset()

    class Fails(Probe):
        def leave(self, view: View, say: Any) -> None:
            raise ValueError("odd")

    log: list = []
    watch = Watch([Recorder(log, "always"), Settles(log, "settles"), Fails()], Said())
    for epoch, note in ((0, False), (1, False), (2, False), (3, True), (4, False)):
        _run(watch, epoch, note=note)
    # run 2 steady, run 3 checkpointed (every verb), run 4 steady: "settles" enters at runs 0, 1 and 3 only
    assert [name for name, verb, *_ in log if verb == "enter"] == ["always", "settles", "always", "settles", "always",
                                                                    "always", "settles", "always"]
    assert watch.steady_s > 0 and watch.failed == {"Fails": "ValueError('odd')"}
    assert not watch.steady_enter("eval", 5, 0)  # another block: its own first runs
    replay = Watch([Settles(log := [], "settles")], Said(), replay=True)
    for epoch in range(4):
        _run(replay, epoch)
    assert len(log) == 8  # a replay never has steady runs


def test_steady_runs_still_find_an_in_place_change_and_a_draw_between_them() -> None:
    """The steady verbs of OutsideProbe and DrawsProbe: what code between two steady runs changes in
    place or draws is found as at any run."""
    net = torch.nn.Linear(2, 2)
    draws = DrawsProbe()
    watch = Watch([VariablesProbe(), OutsideProbe(), GradProbe(lambda name: None), NamesProbe(), draws], Said())
    found = {}
    for epoch in range(8):
        found[epoch] = _run(watch, epoch, (net,), note=epoch == 0).get("outside")
        if epoch == 4:
            with torch.no_grad():
                net.bias.add_(1.0)
            random.random()
    assert watch.steady_s > 0  # runs 2 to 7 were steady
    assert {e: f for e, f in found.items() if f} == {5: {"end() object 0: bias": 1}}
    assert draws.noted() == {"train": ["python"]}


def test_an_end_without_step_into_notes_nothing() -> None:
    watch = Watch([VariablesProbe()], Said())
    assert watch.leave(sys._getframe(), ()) == ({}, [])
    watch.enter("train", 0, 0, sys._getframe())
    watch.drop()  # closed without end(): an exception, `continue`
    assert watch.leave(sys._getframe(), ()) == ({}, [])


# -- VariablesProbe ------------------------------------------------------------------------------


def test_variables_a_block_changes_are_noted_and_restored() -> None:
    said = Said()
    watch = Watch([VariablesProbe()], said)
    step, hist, best, name = 0, [0.5], float("inf"), "run"
    frame = sys._getframe()
    watch.enter("train", 0, 0, frame)
    step, best = step + 4, 0.25
    hist.append(0.25)
    noted, _ = watch.leave(frame, ())
    assert noted["vars"] == {"step": 4, "best": 0.25, "hist": {"t": "list", "v": [0.5, 0.25]}}  # not `name`: unchanged
    assert said == []
    # a replay that restores the block: the values come back in this frame
    step, hist, best = 0, [], 9.0
    replay = Watch([VariablesProbe()], said, replay=True)
    replay.enter("train", 0, 0, frame)
    _, left = replay.leave(frame, (), noted)
    assert (step, hist, best, name) == (4, [0.5, 0.25], 0.25, "run") and left == []
    assert said.codes() == ["FL326"]


def test_a_variable_bound_to_state_that_is_not_plain_data_is_named_once() -> None:
    said = Said()
    watch = Watch([VariablesProbe()], said)
    best_state = None
    frame = sys._getframe()
    for epoch in range(2):
        watch.enter("train", epoch, 0, frame)
        best_state = {"w": torch.zeros(2)}  # a copy of the best weights, kept outside end()
        watch.leave(frame, ())
    assert said.codes() == ["FL207"] and "`best_state`" in said[0][2]
    del best_state


def test_a_variable_given_to_end_is_not_noted() -> None:
    watch = Watch([VariablesProbe()], Said())
    hist: list[float] = []
    frame = sys._getframe()
    watch.enter("train", 0, 0, frame)
    hist.append(1.0)
    noted, _ = watch.leave(frame, (hist,))
    assert "vars" not in noted


# -- OutsideProbe --------------------------------------------------------------------------------


def test_in_place_changes_between_blocks_are_noted_and_others_named_on_replay() -> None:
    net = torch.nn.BatchNorm1d(2)
    said = Said()
    watch = Watch([OutsideProbe()], said)
    frame = sys._getframe()
    watch.enter("train", 0, 0, frame)
    watch.leave(frame, (net,))
    net(torch.randn(4, 2))  # a forward in training mode, between blocks: running statistics move
    watch.enter("train", 1, 0, frame)
    noted, _ = watch.leave(frame, (net,))
    assert noted["outside"]["end() object 0: num_batches_tracked"] == 1
    # replaying: the same changes are the recording's; two forwards are not
    replay = Watch([OutsideProbe()], said, replay=True)
    replay.enter("train", 0, 0, frame)
    replay.leave(frame, (net,))
    net(torch.randn(4, 2))
    assert replay.enter("train", 1, 0, frame, noted) == []
    replay.leave(frame, (net,))
    net(torch.randn(4, 2))
    net(torch.randn(4, 2))
    assert "end() object 0: num_batches_tracked" in replay.enter("train", 2, 0, frame, noted)
    assert said.codes() == ["FL328"]


def test_in_place_changes_are_found_between_runs_without_a_checkpoint_and_on_a_replaced_parameter() -> None:
    """The modules' tensors are walked at checkpointed runs (and every WALK_EVERY runs); their counters
    are read at every run: a change between two quiet runs is found, and a parameter the script
    replaced between two runs is found replaced at the next, and read from there on."""
    net = torch.nn.Linear(2, 2)
    watch = Watch([OutsideProbe()], Said())
    frame = sys._getframe()
    found = []
    for epoch in range(OutsideProbe().changes.WALK_EVERY + 4):
        watch.enter("train", epoch, 0, frame, note=epoch % 50 == 0)
        found.append(watch.leave(frame, (net, epoch))[0].get("outside", {}))  # an int beside: the walk is kept
        if epoch == 3:
            with torch.no_grad():
                net.bias.add_(1.0)  # between two runs without a checkpoint
        if epoch == 10:
            net.weight = torch.nn.Parameter(torch.zeros(2, 2))  # a new tensor: found replaced, then read
        if epoch in (11, 52):
            with torch.no_grad():
                net.weight.mul_(2.0)
        if epoch == 20:
            torch.nn.Linear(3, 3)  # registered elsewhere: the walk again finds nothing here changed
    assert found[4] == {"end() object 0: bias": 1}
    assert found[11] == {"end() object 0: weight": REPLACED}
    assert found[12] == {"end() object 0: weight": 1} and found[53] == {"end() object 0: weight": 1}
    assert [i for i, f in enumerate(found) if f] == [4, 11, 12, 53]


def test_a_submodule_replaced_or_removed_between_runs_is_found() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    changes = OutsideChanges()
    changes.ended((net,))
    net[0] = torch.nn.Linear(2, 2)
    assert changes.started() == {"end() object 0: 0.weight": REPLACED, "end() object 0: 0.bias": REPLACED}
    changes.ended((net,))
    net[1].running_var = None  # a buffer set to None: gone from the walk
    assert changes.started() == {"end() object 0: 1.running_var": REPLACED}


# -- ContainerProbe, NamesProbe, ModuleAttrProbe, GradProbe -------------------------------------------


def test_a_grown_container_is_named_unless_its_values_were_noted() -> None:
    said = Said()
    watch = Watch([VariablesProbe(), ContainerProbe()], said)
    losses, outputs = [], []
    frame = sys._getframe()
    watch.enter("train", 0, 0, frame)
    losses.append(0.5)  # plain data: noted, so a restore sets it
    outputs.append(torch.zeros(2))  # tensors: not noted, so named
    watch.leave(frame, ())
    assert "FL203" in said.codes() and "`outputs`" in dict(zip(said.codes(), [s[2] for s in said]))["FL203"]
    assert not any("`losses`" in text for _, _, text in said)


def test_a_name_the_block_binds_and_the_code_after_reads_is_named() -> None:
    said = Said()
    watch = Watch([VariablesProbe(), NamesProbe()], said)
    batch = None
    frame = sys._getframe()
    if watch.enter("train", 0, 0, frame) == []:  # the `if` whose test calls step_into
        batch = torch.zeros(3)  # a tensor of more than one value: not plain data, not noted
    watch.leave(frame, ())
    print(batch.sum())  # the code after end() reads it
    assert said.codes() == ["FL204"] and "`batch`" in said[0][2]


def test_a_changed_plain_attribute_of_a_given_module_is_named() -> None:
    said = Said()
    net = torch.nn.Linear(2, 1)
    net.temperature = 1.0
    watch = Watch([ModuleAttrProbe()], said)
    frame = sys._getframe()
    watch.enter("train", 0, 0, frame)
    net.temperature *= 0.5
    watch.leave(frame, (net,))
    assert said.codes() == ["FL206"] and "`net.temperature`" in said[0][2]


def test_a_block_that_adds_to_the_gradients_its_last_run_left_is_told() -> None:
    carried: list[str] = []
    said = Said()
    net = torch.nn.Linear(2, 1)
    watch = Watch([GradProbe(carried.append)], said)
    frame = sys._getframe()
    for epoch in range(2):
        watch.enter("train", epoch, 0, frame)
        net(torch.ones(1, 2)).sum().backward()  # no zero_grad: the second run adds to the first's
        watch.leave(frame, (net,))
    assert carried == ["train"] and said.codes() == ["FL208"]


@pytest.mark.parametrize("probe", [VariablesProbe, OutsideProbe, ContainerProbe, NamesProbe, ModuleAttrProbe])
def test_every_probe_survives_a_frame_of_none(probe: type) -> None:
    watch = Watch([probe()], Said())
    watch.enter("train", 0, 0, None)
    assert watch.leave(None, ())[1] == [] and watch.failed == {}


# -- LoopState -----------------------------------------------------------------------------------


def test_the_loops_variables_are_noted_at_each_epoch_end_and_set_in_a_worker_that_starts_later(tmp_path) -> None:
    from flor.watch.loop import LoopState, StateFile, read_state

    path = tmp_path / "state.jsonl"

    def record() -> None:
        best, patience, history, started = 9.0, 0, [], "12:00"  # noqa: F841 - read from this frame
        file = StateFile(path)
        state = LoopState(sys._getframe(), file)

        def epochs():  # as flor.it drives it: started as the loop takes its first item
            state.start()
            yield from range(3)

        for epoch in epochs():
            best, patience = min(best, 3.0 - epoch), patience + 1
            history.append(epoch)
            state.epoch_end(epoch, passed=())
        state.close()
        file.close()

    def worker() -> tuple:
        best, patience, history, started = 9.0, 0, [], "13:00"  # as this worker's code before the loop sets them
        said = Said()
        restored, left = LoopState(sys._getframe()).restore(read_state(path), 1, said)
        return (best, patience, history, started), restored, left, said.codes()

    record()
    values, restored, left, codes = worker()
    assert values == (2.0, 2, [0, 1], "13:00")  # `started` never changed in the loop: left as this worker set it
    assert restored == ["best", "history", "patience"] and left == [] and codes == ["FL320", "FL320"]
