"""flor.watch.frames: here ``PassedIds``, the objects given to ``end()`` in an epoch, whose ids are
found only when read or once ``FOLD`` tuples are held (``id()`` is an audit event)."""

from __future__ import annotations

import torch

from flor.watch.frames import PassedIds


def test_every_object_given_this_epoch_is_passed_numbers_are_not_and_few_tuples_are_held() -> None:
    passed = PassedIds()
    net = torch.nn.Linear(2, 2)
    batches = [torch.zeros(3) for _ in range(20)]
    for i, batch in enumerate(batches):  # a block per batch: end(net, batch, step)
        passed.add((net, batch, i))
        assert len(passed._held) < PassedIds.FOLD  # what is held stays bounded
    assert passed.ids == {id(net), *map(id, batches), 0}
    passed.add((net, batches[0], 0))
    passed.clear()
    assert passed._held == [] and passed.ids == set()  # nothing held after the epoch
    passed.add((net, 1.5, "name"))
    assert passed.ids == {id(net), id("name"), 0}  # a string is not a number: its id is kept
