"""flor.watch.carried: a value a block's next run reads before binding it (a prefetched batch) is
kept with a checkpointed run and set by a replay that restores it; past the limit, or not a
tensor, it is named. A test function's own frame and source are the block's."""

from __future__ import annotations

import sys
from typing import Any

import torch

from flor.watch.carried import CarriedProbe, carried_bytes
from flor.watch.probe import Watch
from flor.watch.variables import VariablesProbe


class Said(list):
    def __call__(self, code: str, subject: Any, text: str) -> None:
        self.append((code, subject, text))

    def codes(self) -> list[str]:
        return [code for code, _, _ in self]


def test_a_prefetched_batch_is_noted_with_a_checkpointed_run_and_set_by_a_restore() -> None:
    said = Said()
    watch = Watch([VariablesProbe(), CarriedProbe()], said)
    X, total, noted = torch.zeros(3), 0.0, []
    for epoch in range(2):
        if watch.enter("train", epoch, 0, sys._getframe()) == []:  # the block's `if`
            total += float(X.sum())  # reads the batch the last run fetched ...
            X = torch.full((3,), float(epoch + 1))  # ... and fetches the next
        noted.append(watch.leave(sys._getframe(), ())[0])
    assert torch.equal(noted[1]["carried"]["X"], torch.full((3,), 2.0)) and said.codes() == []
    assert "X" not in noted[1].get("vars", {})  # a tensor: kept beside the objects, not as a variable

    replay = Watch([VariablesProbe(), CarriedProbe()], said, replay=True)
    X = torch.zeros(3)  # as the script binds it before the loop
    if replay.enter("train", 1, 0, sys._getframe(), {}) == ["never"]:  # the block's `if`: skipped by the restore
        X = X + 1  # the same block: reads the batch first
    _, left = replay.leave(sys._getframe(), (), {"carried_values": {"X": torch.full((3,), 2.0)}})
    assert left == [] and torch.equal(X, torch.full((3,), 2.0)) and said.codes() == ["FL335"]


def test_a_re_executed_run_compares_its_carried_values_with_the_checkpoints_by_digest() -> None:
    """Re-executed from its checkpoint (a probed block), a run whose next batch differs from the
    recorded one diverges like its objects would; the same batch verifies."""
    from flor.state import snapshot

    said = Said()
    watch = Watch([VariablesProbe(), CarriedProbe()], said)
    X = torch.zeros(3)
    for epoch in range(2):
        if watch.enter("train", epoch, 0, sys._getframe()) == []:  # the block's `if`
            _ = float(X.sum())  # reads the batch the last run fetched ...
            X = torch.full((3,), float(epoch + 1))  # ... and fetches the next
        noted = watch.leave(sys._getframe(), ())[0]
    recorded = {"carried_tree": snapshot(noted["carried"], copy=False).materialize()}  # as the manifest has it

    for fetched, found in ((2.0, []), (5.0, ["carried `X`"])):
        replay = Watch([VariablesProbe(), CarriedProbe()], said, replay=True)
        X = torch.full((3,), 1.0)
        if replay.enter("train", 1, 0, sys._getframe(), {}) == []:  # the block's `if`: re-executed
            _ = float(X.sum())
            X = torch.full((3,), fetched)
        assert replay.leave(sys._getframe(), (), None, recorded)[1] == found
    assert said.codes() == []


def test_a_carried_value_it_cannot_keep_is_named_at_record_and_left_by_a_restore() -> None:
    said = Said()
    watch = Watch([VariablesProbe(), CarriedProbe()], said)
    batch: Any = iter([1, 2, 3])
    for epoch in range(2):
        if watch.enter("train", epoch, 0, sys._getframe()) == []:  # the block's `if`
            n = next(batch)
            batch = iter([n, n + 1])  # not a tensor or array: not kept
        noted = watch.leave(sys._getframe(), ())[0]
    assert said.codes() == ["FL211"] and noted["carried_left"] == ["batch"]

    replay = Watch([VariablesProbe(), CarriedProbe()], said, replay=True)
    if replay.enter("train", 1, 0, sys._getframe(), {}) == ["never"]:  # the block's `if`
        batch = iter([next(batch)])
    _, left = replay.leave(sys._getframe(), (), {"carried_left": ["batch"]})
    assert left == ["batch"] and said.codes()[-1] == "FL336"


def test_carried_bytes_counts_tensors_arrays_and_batches_of_them() -> None:
    import numpy as np

    assert carried_bytes(torch.zeros(4, dtype=torch.float64)) == 32
    assert carried_bytes({"x": np.zeros(2, dtype=np.int32), "y": torch.zeros(2, dtype=torch.int8)}) == 10
    assert carried_bytes([torch.zeros(1), "label"]) is None and carried_bytes(np.array(["a"])) is None
