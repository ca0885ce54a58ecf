"""The global random generators: Python, NumPy, torch CPU and every initialized CUDA device.
"""

from __future__ import annotations

import array
import random
import sys
from typing import Any

import numpy as np
import torch

from ..errors import StateError

__all__ = ["RNG_BYTES", "capture_rng", "restore_rng"]


#: about the bytes one capture_rng() holds on the CPU (Python 2.5 kB, NumPy 2.5 kB, torch 5 kB)
RNG_BYTES = 10_000


def capture_rng(like: Any = None) -> dict:
    """The global generators' states: Python, NumPy, torch CPU and every initialized CUDA device.

    Python's Mersenne Twister state (625 words) is kept as raw little-endian bytes, a leaf of
    2.5 kB rather than 625 JSON numbers; ``like``, a recorded RNG tree of a flor that kept the
    numbers, makes this capture keep them too, so the two compare.
    """
    version, words, gauss = random.getstate()
    if not _python_words_listed(like):
        packed = array.array("I", words)
        if sys.byteorder == "big":
            packed.byteswap()
        words = packed.tobytes()  # type: ignore[assignment]
    state: dict[str, Any] = {
        "python": (version, words, gauss),
        "numpy": np.random.get_state(legacy=False),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Any) -> None:
    """Set the global generators; called last, after every object is restored."""
    if not isinstance(state, dict) or not {"python", "numpy", "torch"} <= set(state):
        raise StateError("the recorded random state lacks the python, numpy or torch generator; the checkpoint "
                         "is damaged")
    try:
        random.setstate(_python_state(state["python"]))
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
    except Exception as exc:  # noqa: BLE001 - a damaged state is named, whatever the generator raises
        raise StateError(f"the recorded random state cannot be set ({type(exc).__name__}: {exc}); the checkpoint "
                         "is damaged") from exc
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if not isinstance(cuda, (list, tuple)) or len(cuda) != torch.cuda.device_count():
            raise StateError(
                f"the recording saw {len(cuda) if isinstance(cuda, (list, tuple)) else '?'} CUDA devices, this "
                f"process sees {torch.cuda.device_count()}; replay with the same CUDA_VISIBLE_DEVICES count"
            )
        try:
            torch.cuda.set_rng_state_all(cuda)
        except Exception as exc:  # noqa: BLE001
            raise StateError(f"the recorded CUDA random state cannot be set ({exc}); the checkpoint is damaged") from exc


def _python_words_listed(tree: Any) -> bool:
    """Whether a recorded RNG tree keeps Python's state words as a list of numbers (older flor)."""
    try:
        node = tree["v"][tree["k"].index("python")]["v"][1]
    except (TypeError, KeyError, ValueError, IndexError):
        return False
    return isinstance(node, dict) and node.get("t") in ("tuple", "list")


def _python_state(value: Any) -> tuple:
    """``random.setstate``'s argument from a captured state (words as raw bytes, or numbers)."""
    if isinstance(value, (list, tuple)) and len(value) == 3 and isinstance(value[1], (bytes, bytearray)):
        words = array.array("I")
        if words.itemsize != 4 or len(value[1]) % 4:
            raise StateError("the recorded Python random state is not a whole number of 32-bit words; the "
                             "checkpoint is damaged")
        words.frombytes(bytes(value[1]))
        if sys.byteorder == "big":
            words.byteswap()
        return (value[0], tuple(words), value[2])
    return _as_tuple(value)


def _as_tuple(x: Any) -> Any:
    return tuple(_as_tuple(i) for i in x) if isinstance(x, (list, tuple)) else x
