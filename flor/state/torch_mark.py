"""What tells whether torch's CPU generator drew, read from its memory: ``fingerprints``
(``flor.state.rng``) compares it at every block run, where ``get_state()`` would copy 5 kB
into a new tensor twice a run (~2 us each, ~10 right after a training step has taken the caches).

The generator (``CPUGeneratorImpl``) holds a Mersenne Twister (``mt19937_data_pod``: ``uint64
seed_``, ``int left_``, ``bool seeded_``, ``uint32 next_``, then 624 ``uint32`` words) followed
by two ``std::optional`` spare normal deviates (a ``float``, a ``double``; ``SPARES_AT``): 2,540
bytes that hold all ``get_state()`` reads. The mark (``TorchMark``) is a copy of them; two marks are equal
where those bytes are, and otherwise exactly where ``get_state()`` of each is: the bytes are
written into a private generator and its ``get_state()`` read. That second look is needed:
``torch.random.fork_rng()`` puts the state back through ``set_state()``, which leaves a
spare's flag byte and padding changed where no draw happened and ``get_state()`` reads no
change (a plain comparison of the bytes called that a draw between blocks, FL325, over values
equal to a full run's). It is taken only where the bytes differ: after a draw, or such a put-back.

The words are found once in a private generator's memory by the words its ``get_state()``
gives, and the layout is kept only if, on that generator, the header agrees with
``get_state()`` and, over a sequence of draws of every kind (uniform, a spare deviate set and
used up, float64, integers, a reseed), the mark changes at each draw and stays where nothing
is drawn; then
the global generator's header must agree with its ``get_state()`` (read only: it is not drawn
from). Anything else (another torch, Python, or build) gives None, and ``fingerprints`` falls
back to ``get_state()``.
"""

from __future__ import annotations

import ctypes
import platform
import struct
import sys
import threading
from functools import partial
from typing import Any, Callable

import torch

__all__ = ["HEADER", "SPARES_AT", "TorchMark", "torch_mark", "torch_marker", "torch_view"]

_WORDS = 624
HEADER = "@qi?xxxI"  # seed_, left_, seeded_, (padding), next_: the 20 bytes before the words
#: after the words and 4 bytes of padding, the spares: ``std::optional<float>`` (value, flag, padding),
#: then ``std::optional<double>`` (value, flag) at ``SPARES_AT + 8`` (flor.state.draw_marks reads them)
SPARES_AT = 20 + 4 * _WORDS + 4
_SIZE = SPARES_AT + 8 + 9 + 3  # through the double's flag and its padding: 2,540 bytes
#: the generator object -> its view (None: it cannot be read raw); kept, so its memory stays valid
_VIEWS: dict[int, tuple[Any, Any]] = {}


def torch_marker(generator: torch.Generator) -> Callable[[], Any] | None:
    """A function that returns ``generator``'s mark (equal to another of its marks exactly when
    its state is the same), or None where its memory cannot be read as expected.

    >>> g = torch.Generator(); _ = g.manual_seed(1); mark = torch_marker(g) or (lambda: g.get_state().tolist())
    >>> a = mark(); _ = torch.randn(1, generator=g); b = mark(); _ = torch.randn(1, generator=g)
    >>> a != b, b != mark(), mark() == mark()  # a spare deviate set, then used up: both are draws
    (True, True, True)
    """
    view = torch_view(generator)
    return None if view is None else partial(torch_mark, view)


def torch_view(generator: torch.Generator) -> Any:
    """``generator``'s memory that ``torch_mark`` reads (a ctypes array), or None where it cannot be
    read as expected; found once a generator."""
    found = _VIEWS.get(id(generator))
    if found is None or found[0] is not generator:
        found = _VIEWS[id(generator)] = (generator, _found_view(generator))
    return found[1]


def torch_mark(view: Any) -> TorchMark:
    """The mark of the generator whose ``torch_view`` is ``view``."""
    return TorchMark((view.raw,))


class TorchMark(tuple):
    """A copy of a generator's fields (``torch_view``'s bytes), equal to another exactly where
    ``get_state()`` would give the same bytes for both."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if type(other) is not TorchMark:
            return False
        return self[0] == other[0] or _state_of(self[0]) == _state_of(other[0])

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = None  # type: ignore[assignment]


_SCRATCH: list[Any] = []  # [a private generator, its view]: where a mark's bytes are read as get_state()
_SCRATCH_LOCK = threading.Lock()


def _state_of(raw: bytes) -> bytes:
    """``get_state()``'s bytes for a generator whose fields are ``raw``."""
    with _SCRATCH_LOCK:
        if not _SCRATCH:
            scratch = torch.Generator()
            view = torch_view(scratch)
            if view is None:  # a view was found for the generator the mark came from: the same layout
                raise RuntimeError("flor: torch's generator layout changed while running")
            _SCRATCH.extend((scratch, view))
        scratch, view = _SCRATCH
        ctypes.memmove(ctypes.addressof(view), raw, _SIZE)
        return scratch.get_state().numpy().tobytes()


def _found_view(generator: torch.Generator) -> Any:
    offset = _LAYOUT[0] if _LAYOUT else _LAYOUT.setdefault(0, _layout())
    if offset is None or generator.device.type != "cpu":
        return None
    try:
        view = _view(generator, offset)
        if view is None or not _header_agrees(view, generator.get_state().numpy().tobytes()):
            return None
    except Exception:  # noqa: BLE001 - any surprise: get_state, as before
        return None
    return view


def _view(generator: torch.Generator, offset: int) -> Any:
    """The generator's ``mt19937_data_pod`` and spares as a ctypes array over its memory."""
    impl = _impl(generator)
    return None if not impl else (ctypes.c_char * _SIZE).from_address(impl + offset - 20)


def _impl(generator: torch.Generator) -> int | None:
    """The address of ``generator``'s ``GeneratorImpl``: a ``THPGenerator`` is its object header, the
    ``at::Generator`` (one pointer to it), then a weak-reference list; None where the type is not
    laid out so (another torch: no pointer is followed then)."""
    pointer = ctypes.sizeof(ctypes.c_void_p)
    if type(generator) is not torch.Generator or torch.Generator.__basicsize__ != object.__basicsize__ + 2 * pointer:
        return None
    return ctypes.c_void_p.from_address(id(generator) + object.__basicsize__).value


def _header_agrees(view: Any, state: bytes) -> bool:
    """Whether the raw fields are what ``get_state()`` (``CPUGeneratorImplStateLegacy``: ``int64
    seed, int left, int seeded, uint64 next, uint64 words[624], ...``) says."""
    seed, left, seeded, nxt = struct.unpack_from("@qiiQ", state, 0)
    words = struct.unpack_from(f"@{_WORDS}Q", state, 24)
    raw = bytes(view)
    return (struct.unpack_from(HEADER, raw, 0) == (seed, left, bool(seeded), nxt)
            and raw[20:20 + 4 * _WORDS] == struct.pack(f"@{_WORDS}I", *words))


_LAYOUT: dict[int, int | None] = {}


def _layout() -> int | None:
    """The offset of the words in a ``CPUGeneratorImpl``, checked on a private generator."""
    try:
        if platform.python_implementation() != "CPython" or sys.byteorder != "little":
            return None
        probe = torch.Generator()
        probe.manual_seed(20261207)
        torch.rand(3, generator=probe)
        state = probe.get_state().numpy().tobytes()
        words = struct.pack(f"@{_WORDS}I", *struct.unpack_from(f"@{_WORDS}Q", state, 24))
        impl = _impl(probe)
        if not impl:
            return None
        at = ctypes.string_at(impl, 512).find(words[:16])
        if at < 20 or ctypes.string_at(impl + at, len(words)) != words:
            return None
        view = (ctypes.c_char * _SIZE).from_address(impl + at - 20)
        draws: list[Callable[[], Any] | None] = [  # None: nothing drawn
            None, lambda: torch.rand(2, generator=probe), lambda: torch.randn(1, generator=probe), None,
            lambda: torch.randn(1, generator=probe), lambda: torch.randn(1, generator=probe),
            lambda: torch.randn(1, generator=probe, dtype=torch.float64),
            lambda: torch.randint(9, (3,), generator=probe),
            lambda: torch.randn(40, generator=probe), lambda: torch.rand(1000, generator=probe),
            lambda: probe.manual_seed(20261206), lambda: torch.randn(1, generator=probe), None,
        ]
        for draw in draws:
            before, raw = probe.get_state().numpy().tobytes(), view.raw
            if draw is not None:
                draw()
            after = probe.get_state().numpy().tobytes()
            # a draw changes get_state's bytes and the fields; nothing drawn, the fields stay (read as bytes:
            # a mark's comparison would find the layout it is being checked for)
            moved = after != before if draw is not None else False
            if moved != (view.raw != raw) or not _header_agrees(view, after):
                return None
        return at
    except Exception:  # noqa: BLE001 - any surprise: get_state, as before
        return None
