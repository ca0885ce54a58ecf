"""What tells whether code drew from the global random generators between two instants, read in
~1 µs: one bytes object joined from live views of their memory (``draw_reader``).

``flor.watch.draws`` reads the generators after every block run and again before the next one (a
hindsight line that samples between blocks makes a full run differ from a replay). After a
training step the caches hold torch's memory, not flor's, and reading each generator's fields
as Python objects (``flor.state.rng.markers``: slices, ints, a tuple a generator) took ~4.5 µs
a read; a ``bytes.join`` of ``memoryview``s made once over the few bytes that move at a draw
takes ~0.8, and comparing two of them is one ``==``.

The bytes read, a generator:

- Python's ``random``: its position and first two words (a draw moves the position; the 624th
  since the last twist twists every word; a seed sets the position to 624 and the first word to
  the same constant, the second to one of the seed's), and the spare normal deviate
  ``gauss_next`` (an attribute);
- NumPy's legacy global ``RandomState``: the first two key words, the position, ``has_gauss`` and
  the spare deviate;
- torch's CPU generator (``flor.state.torch_mark``'s view): ``seed_``, ``left_``, ``seeded_``,
  ``next_`` and the first two words, then the spare float and double normal deviates with their
  flags. ``get_state()`` reads a spare's value only where its flag is set, and
  ``torch.random.fork_rng()``'s put-back (``set_state``) clears a flag over a value it leaves, and
  changes the padding: where those bytes differ, the fields are compared as ``get_state()`` reads
  them (``torch_fields``), so a put-back is no draw;
- CUDA's devices, once initialized: their states (``flor.state.rng.markers``' CUDA mark).

Every kind of draw moves a position or twists the words, and a reseed sets ``seed_`` and the
position, so the marks are equal exactly when nothing drew; only a ``set_state`` to a state that
differs in words past the first two at the same position would read as no draw. Where a view
cannot be made (another Python, NumPy or torch laid out otherwise), ``draw_reader`` gives the
per-generator marks of ``flor.state.rng.markers``.
"""

from __future__ import annotations

import ctypes
import random
import struct
from typing import Any, Callable

import numpy as np
import torch

from .rng import cuda_mark, markers, numpy_memory, python_memory
from .torch_mark import HEADER, SPARES_AT, torch_view

__all__ = ["draw_reader", "torch_fields"]

#: torch's generator, in ``torch_view``'s bytes (``flor.state.torch_mark``): its header (seed_, left_,
#: seeded_, next_) and the first two words; then at ``SPARES_AT`` the optional float and double spares
_HEAD = struct.Struct(f"={HEADER.lstrip('@')}8s")
_SPARES = struct.Struct("=f?3xd?")
#: ``get_state()``'s bytes: the double spare and its flag, the float spare and its flag
_STATE_DOUBLE, _STATE_DOUBLE_VALID, _STATE_FLOAT = 5024, 5040, 5048

EMPTY: frozenset[str] = frozenset()
Reader = tuple[tuple[str, ...], Callable[[], Any], Callable[[Any, Any], "set[str] | frozenset[str]"]]


def torch_fields(region: bytes) -> tuple:
    """The fields of torch's generator that ``get_state()`` reads, from ``draw_reader``'s bytes of it
    (``_HEAD`` then ``_SPARES``): a spare's value only where its flag is set.

    >>> g = torch.Generator(); _ = g.manual_seed(1); view = torch_view(g); _ = torch.randn(1, generator=g)
    >>> region = view.raw[:_HEAD.size] + view.raw[SPARES_AT:SPARES_AT + _SPARES.size]
    >>> torch_fields(region)[:4], torch_fields(region)[-1] == g.get_state()[5024:5032].view(torch.float64).item()
    ((1, 621, True, 4), True)
    """
    seed, left, seeded, nxt, words = _HEAD.unpack_from(region, 0)
    f, has_f, d, has_d = _SPARES.unpack_from(region, _HEAD.size)
    return seed, left, seeded, nxt, words, has_f, f if has_f else None, has_d, d if has_d else None


def draw_reader(skip: frozenset[str] | set[str] = frozenset()) -> Reader:
    """The generators read but those in ``skip``, ``read()``: their mark now, and ``drawn(before,
    now)``: the generators drawn from between two marks (CUDA's only once it was initialized).

    >>> keys, read, drawn = draw_reader({"numpy"}); a = read(); _ = random.random(); b = read()
    >>> sorted(drawn(a, b)), drawn(b, read()), "numpy" in keys
    (['python'], frozenset(), False)
    """
    keys, each = markers(skip)
    return _joined(keys) or (keys, each, _differ(keys))


def _differ(keys: tuple[str, ...]) -> Callable[[Any, Any], set[str] | frozenset[str]]:
    def drawn(before: list, now: list) -> set[str] | frozenset[str]:
        if before == now:
            return EMPTY
        return {k for k, a, b in zip(keys, before, now) if a != b and None not in (a, b)}

    return drawn


def _bytes(obj: Any, size: int) -> memoryview:
    """A live view of the first ``size`` bytes of a ctypes object's memory."""
    return memoryview((ctypes.c_char * size).from_address(ctypes.addressof(obj))).cast("B")


def _joined(keys: tuple[str, ...]) -> Reader | None:
    """``draw_reader`` over one ``bytes.join`` of live views; None where a view cannot be made."""
    python, numpy_, generator = python_memory(), numpy_memory(), torch.default_generator
    tview = torch_view(generator)
    cuda_module = torch.cuda
    if python is None or numpy_ is None or tview is None or not hasattr(cuda_module, "_initialized") \
            or not _spares_agree():
        return None
    inst, pview = python
    rs, bitgen, (state, has_gauss, gauss) = numpy_
    views: list[memoryview] = []
    spans: list[tuple[str, int, int]] = []  # generator -> its bytes in the joined mark
    for key, parts in (("python", lambda: [_bytes(pview, 12)]),
                       ("numpy", lambda: [_bytes(state, 8), _bytes(state, len(state))[-4:],
                                          _bytes(has_gauss, ctypes.sizeof(has_gauss)),
                                          _bytes(gauss, ctypes.sizeof(gauss))]),
                       ("torch", lambda: [_bytes(tview, _HEAD.size),
                                          _bytes(tview, SPARES_AT + _SPARES.size)[SPARES_AT:]])):
        if key in keys:
            start = sum(v.nbytes for v in views)
            views.extend(parts())
            spans.append((key, start, sum(v.nbytes for v in views)))
    torch_span = next(((s, e) for key, s, e in spans if key == "torch"), None)
    joined, mtrand = tuple(views), np.random.mtrand
    join = b"".join
    with_python, with_cuda = "python" in keys, "cuda" in keys
    every = frozenset(k for k in keys if k != "cuda")

    def read() -> Any:
        if random._inst is not inst or mtrand._rand is not rs or rs._bit_generator is not bitgen \
                or torch.default_generator is not generator:
            return None  # another generator object: the views read the one they were made over
        return (join(joined), inst.gauss_next if with_python else None,  # type: ignore[attr-defined]
                cuda_mark() if with_cuda and cuda_module._initialized else None)

    def drawn(before: Any, now: Any) -> set[str] | frozenset[str]:
        if before == now:
            return EMPTY
        if before is None or now is None:
            return every  # a global generator was replaced: as drawn from
        a, b = before[0], now[0]
        found = {key for key, start, end in spans if a[start:end] != b[start:end]}
        if "torch" in found and torch_span is not None:
            start, end = torch_span
            if torch_fields(a[start:end]) == torch_fields(b[start:end]):
                found.discard("torch")  # a put-back: a flag cleared over its value, padding
        if with_python and before[1] != now[1]:
            found.add("python")
        x, y = before[2], now[2]
        if with_cuda and x != y and None not in (x, y):
            found.add("cuda")
        return found

    return keys, read, drawn


_AGREE: list[bool] = []


def _spares_agree() -> bool:
    """Whether ``torch_fields`` reads the spares as ``get_state()`` does, on a private generator
    through draws that set, use up and leave them (checked once a process)."""
    if not _AGREE:
        _AGREE.append(_check_spares())
    return _AGREE[0]


def _check_spares() -> bool:
    try:
        probe = torch.Generator()
        probe.manual_seed(20261207)
        view = torch_view(probe)
        if view is None:
            return False
        def float_spare() -> None:  # no common draw sets it: set through set_state, as a put-back would
            state = bytearray(probe.get_state().numpy().tobytes())
            struct.pack_into("=f?", state, _STATE_FLOAT, 0.25, True)
            probe.set_state(torch.frombuffer(state, dtype=torch.uint8).clone())

        for draw in (None, lambda: torch.randn(1, generator=probe), lambda: torch.randn(1, generator=probe),
                     lambda: torch.randn(1, generator=probe, dtype=torch.float64),
                     lambda: torch.normal(0.0, 1.0, (1,), generator=probe), float_spare,
                     lambda: probe.set_state(probe.get_state()), lambda: torch.rand(5, generator=probe)):
            if draw is not None:
                draw()
            raw, state = view.raw, probe.get_state().numpy().tobytes()
            fields = torch_fields(raw[:_HEAD.size] + raw[SPARES_AT:SPARES_AT + _SPARES.size])
            (d,), (valid,) = struct.unpack_from("=d", state, _STATE_DOUBLE), struct.unpack_from("=i", state,
                                                                                                 _STATE_DOUBLE_VALID)
            f, has_f = struct.unpack_from("=f?", state, _STATE_FLOAT)
            if fields[5:] != (has_f, f if has_f else None, bool(valid), d if valid else None):
                return False
        return True
    except Exception:  # noqa: BLE001 - any surprise: the per-generator marks
        return False
