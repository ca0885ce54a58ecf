"""flor.state.torch_mark: torch's CPU generator read from its memory, a mark that changes at every
kind of draw (a spare normal deviate used up moves no position) and stays where nothing is drawn."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from flor.state.rng import fingerprints
from flor.state.torch_mark import torch_marker, torch_view

DRAWS: list[tuple[str, Callable[[torch.Generator], Any]]] = [
    ("uniform", lambda g: torch.rand(1, generator=g)),
    ("a spare deviate set", lambda g: torch.randn(1, generator=g)),
    ("the spare used up", lambda g: torch.randn(1, generator=g)),
    ("float64 normal", lambda g: torch.randn(1, generator=g, dtype=torch.float64)),
    ("integers", lambda g: torch.randint(10, (5,), generator=g)),
    ("a permutation", lambda g: torch.randperm(7, generator=g)),
    ("many (twists)", lambda g: torch.rand(3000, generator=g)),
    ("a whole turn of words", lambda g: torch.randint(2**31, (624,), generator=g)),
    ("a reseed", lambda g: g.manual_seed(5)),
    ("bernoulli", lambda g: torch.bernoulli(torch.full((3,), 0.5), generator=g)),
]


def test_torch_cpu_generator_is_read_raw_here() -> None:
    """CPython on x86-64 with this torch: the layout is found (else the probe pays get_state twice a run)."""
    assert torch_marker(torch.default_generator) is not None
    assert torch_view(torch.default_generator) is torch_view(torch.default_generator)  # found once


@pytest.mark.parametrize("kind,draw", DRAWS, ids=[kind for kind, _ in DRAWS])
def test_every_kind_of_draw_changes_the_mark(kind: str, draw: Callable[[torch.Generator], Any]) -> None:
    g = torch.Generator()
    g.manual_seed(3)
    torch.randn(1, generator=g)  # a spare deviate held
    mark = torch_marker(g)
    assert mark is not None
    before = mark()
    assert mark() == before  # nothing drawn: the same mark
    draw(g)
    assert mark() != before


def test_the_global_generator_drawn_between_two_fingerprints_is_named() -> None:
    torch.randn(1)  # a spare deviate now: the next randn(1) uses it up without moving the position
    a = fingerprints()
    assert fingerprints() == a
    torch.randn(1)
    b = fingerprints()
    assert [k for k in b if a[k] != b[k]] == ["torch"]
    state = torch.get_rng_state()
    torch.rand(4)
    torch.set_rng_state(state)
    torch.randn(1)  # restored, then a spare used up
    assert fingerprints()["torch"] != b["torch"]


def test_a_put_back_state_whose_bytes_changed_is_the_same_mark() -> None:
    """``torch.random.fork_rng()`` puts the state back through ``set_state()``, which changes a
    spare's flag byte and padding but nothing ``get_state()`` reads: the same mark (the bytes
    alone differ), so no FL325 over values equal to a full run's."""
    g = torch.default_generator
    torch.manual_seed(0)
    torch.rand(3)
    view = torch_view(g)
    before, raw = torch_marker(g)(), view.raw
    with torch.random.fork_rng():
        torch.randn(5)
    assert view.raw != raw  # the case: memory moved, though nothing was drawn
    assert torch_marker(g)() == before and not torch_marker(g)() != before
    torch.randn(1)
    assert torch_marker(g)() != before
