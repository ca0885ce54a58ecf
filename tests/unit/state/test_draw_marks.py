"""flor.state.draw_marks: one bytes object joined from live views of the global generators' memory
tells every kind of draw from each, and only draws (a put-back by ``fork_rng`` is none); the same
answer as the per-generator marks of ``fingerprints``."""

from __future__ import annotations

import random
import struct
from typing import Any, Callable

import numpy as np
import pytest
import torch

from flor.state.draw_marks import draw_reader
from flor.state.rng import fingerprints

DRAWS: list[tuple[str, str, Callable[[], Any]]] = [
    ("python", "random()", random.random),
    ("python", "a spare deviate set", lambda: random.gauss(0.0, 1.0)),
    ("python", "the spare used up", lambda: random.gauss(0.0, 1.0)),
    ("python", "a whole turn of words", lambda: [random.getrandbits(32) for _ in range(624)]),
    ("python", "a reseed", lambda: random.seed(5)),
    ("numpy", "rand", np.random.rand),
    ("numpy", "a spare deviate set", np.random.standard_normal),
    ("numpy", "the spare used up", np.random.standard_normal),
    ("numpy", "a whole turn of words", lambda: np.random.randint(0, 2**31, 624)),
    ("numpy", "a reseed", lambda: np.random.seed(5)),
    ("torch", "uniform", lambda: torch.rand(1)),
    ("torch", "a spare deviate set", lambda: torch.randn(1)),
    ("torch", "the spare used up", lambda: torch.randn(1)),
    ("torch", "float64 normal", lambda: torch.randn(1, dtype=torch.float64)),
    ("torch", "a float spare", lambda: torch.normal(0.0, 1.0, (1,))),
    ("torch", "integers", lambda: torch.randint(10, (5,))),
    ("torch", "a permutation", lambda: torch.randperm(7)),
    ("torch", "many (twists)", lambda: torch.rand(3000)),
    ("torch", "a whole turn of words", lambda: torch.randint(2**31, (624,))),
    ("torch", "a reseed", lambda: torch.manual_seed(5)),
    ("torch", "bernoulli", lambda: torch.bernoulli(torch.full((3,), 0.5))),
    ("torch", "dropout", lambda: torch.nn.functional.dropout(torch.ones(4), 0.5)),
    ("torch", "a float spare set", lambda: _float_spare(0.25)),
]


def _float_spare(value: float) -> None:
    """torch's global generator given a spare float deviate through ``set_state`` (no common draw sets one)."""
    state = bytearray(torch.get_rng_state().numpy().tobytes())
    struct.pack_into("=f?", state, 5048, value, True)
    torch.set_rng_state(torch.frombuffer(state, dtype=torch.uint8).clone())


@pytest.fixture(autouse=True)
def _seeded():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    torch.randn(1)  # a spare deviate held


def test_the_generators_are_read_joined_here() -> None:
    """CPython on x86-64 with this NumPy and torch: one bytes object (else the per-generator marks)."""
    keys, read, _ = draw_reader()
    assert keys == ("python", "numpy", "torch", "cuda")
    mark = read()
    assert type(mark) is tuple and type(mark[0]) is bytes and len(mark[0]) == 12 + 24 + 28 + 17


@pytest.mark.parametrize("key,kind,draw", DRAWS, ids=[f"{key}-{kind}" for key, kind, _ in DRAWS])
def test_every_kind_of_draw_is_found_from_that_generator_alone(key: str, kind: str, draw: Callable[[], Any]) -> None:
    _, read, drawn = draw_reader()
    before, fingers = read(), fingerprints()
    assert drawn(before, read()) == frozenset()  # nothing drawn
    draw()
    now = fingerprints()
    assert drawn(before, read()) == {key} == {k for k in now if now[k] != fingers[k]}


def test_a_training_step_that_draws_nothing_is_no_draw() -> None:
    net = torch.nn.Linear(4, 4)
    opt = torch.optim.Adam(net.parameters())
    _, read, drawn = draw_reader()
    before = read()
    net(torch.ones(2, 4)).sum().backward()
    opt.step()
    assert drawn(before, read()) == frozenset()


def test_a_put_back_state_is_no_draw_and_a_draw_after_it_is_one() -> None:
    """``torch.random.fork_rng()`` puts the state back through ``set_state()``, which clears a
    spare's flag over the value it leaves and changes padding: the bytes differ, the fields
    ``get_state()`` reads do not."""
    import copy

    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    _, read, drawn = draw_reader()
    for _ in range(3):
        before = read()
        with torch.random.fork_rng(), torch.no_grad():
            copy.deepcopy(net)(torch.ones(8, 4))
        assert drawn(before, read()) == frozenset()
        torch.randn(1)
        assert drawn(before, read()) == {"torch"}


def test_a_generator_skipped_is_not_read() -> None:
    keys, read, drawn = draw_reader({"torch"})
    before = read()
    torch.rand(3)
    assert "torch" not in keys and drawn(before, read()) == frozenset()
    random.random()
    assert drawn(before, read()) == {"python"}


def test_a_global_generator_replaced_counts_as_drawn(monkeypatch) -> None:
    _, read, drawn = draw_reader()
    before = read()
    monkeypatch.setattr(random, "_inst", random.Random(0))
    assert drawn(before, read()) == {"python", "numpy", "torch"}
