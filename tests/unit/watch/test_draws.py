"""flor.watch.draws: the global generators code between blocks draws from, noted while recording
and compared while replaying."""

from __future__ import annotations

import random
import sys
from typing import Any

import torch

from flor.watch.draws import DrawsProbe, recorded_draws
from flor.watch.probe import Watch


class Said(list):
    def __call__(self, code: str, subject: Any, text: str) -> None:
        self.append((code, subject, text))


def _epochs(watch: Watch, draw: bool, restored: dict | None = None) -> None:
    frame = sys._getframe()
    for epoch in range(2):
        watch.enter("train", epoch, 0, frame)
        watch.leave(frame, (), restored)  # restored: {} for a block a replay restores
        if draw:
            torch.rand(1)  # code between the blocks draws


def test_a_replay_names_a_generator_the_recording_never_drew_between_blocks():
    record = DrawsProbe()
    _epochs(Watch([record], Said()), draw=False)
    assert record.noted() == {}
    said = Said()
    _epochs(Watch([DrawsProbe(record.noted())], said, replay=True), draw=True)
    assert said == []  # the blocks after the draw re-executed without a checkpoint: as a full run draws on
    _epochs(Watch([DrawsProbe(record.noted())], said, replay=True), draw=True, restored={})
    assert [code for code, _, _ in said] == ["FL325"] and "torch random generator before 'train'" in said[0][2]


def test_draws_the_recording_made_too_or_an_older_recording_are_not_named():
    record = DrawsProbe()
    _epochs(Watch([record], Said()), draw=True)
    assert record.noted() == {"train": ["torch"]}
    said = Said()
    _epochs(Watch([DrawsProbe(record.noted())], said, replay=True), draw=True)
    _epochs(Watch([DrawsProbe(None)], said, replay=True), draw=True)  # no drew_between in run.json
    assert said == []
    assert recorded_draws({"drew_between": {"train": ["torch", 3]}}) == {"train": ["torch"]}
    assert recorded_draws({}) is None


def test_a_draw_between_runs_without_a_checkpoint_is_noted_and_a_generator_known_drawn_is_not_read_again():
    """At every block run, checkpointed or not (a sampling evaluation every N iterations): numpy's
    generator drawn only before run 7 is noted; torch's, drawn before every run, is not read again
    once every block is known to draw from it."""
    import numpy as np

    probe = DrawsProbe()
    watch = Watch([probe], Said())
    frame = sys._getframe()
    for epoch in range(10):
        watch.enter("train", epoch, 0, frame, note=epoch == 0)
        watch.leave(frame, ())
        torch.rand(1)
        if epoch == 6:
            np.random.rand()
    assert probe.noted() == {"train": ["numpy", "torch"]}
    assert "torch" not in probe.last[0] and "python" in probe.last[0]  # what the next run compares (its keys)
    watch.enter("eval", 10, 0, frame, note=False)  # a new block: every generator is read again
    watch.leave(frame, ())
    assert "torch" in probe.last[0]
