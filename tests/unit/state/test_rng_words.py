"""Python's RNG words are raw bytes in every checkpoint of manifest format 3: the list of 625
numbers earlier flor wrote is refused as damage, and a module node's ``frozen``/``eval`` lists
are compared as they are."""

from __future__ import annotations

import inspect
import random

import numpy as np
import pytest
import torch

from flor.errors import StateError
from flor.state import capture_rng, diff_nodes, restore_rng


def test_python_words_as_numbers_are_refused():
    state = {"python": random.getstate(), "numpy": np.random.get_state(legacy=False), "torch": torch.get_rng_state()}
    with pytest.raises(StateError, match=r"Python random state is not \(version, words as bytes, gauss\); the "
                                         "checkpoint is damaged"):
        restore_rng(state)
    assert list(inspect.signature(capture_rng).parameters) == ["raw"]  # no form of an older flor to imitate
    restore_rng(capture_rng())  # the bytes form


def test_a_module_node_without_frozen_and_eval_differs_from_one_with_them():
    module = {"t": "stateful", "cls": "Linear", "frozen": [], "eval": [], "v": {"t": "dict", "k": [], "v": []}}
    other = {"t": "stateful", "cls": "Linear", "v": {"t": "dict", "k": [], "v": []}}
    assert diff_nodes(module, dict(module)) == []
    assert diff_nodes(module, other, "net") == ["net.<requires_grad>", "net.<training>"]
