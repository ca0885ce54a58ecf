"""The script's frames as the probes see them: which frame called flor, its variables, the ids
of what ``end()`` was given, which objects are the script's own, what a loop statement binds."""

from __future__ import annotations

import collections
import dis
import json
import os
import sys
import types
from types import FrameType
from typing import Any, Iterable

from .plain import CONTAINERS, SCALARS, LEAF_TYPES

__all__ = ["CO_OPTIMIZED", "PassedIds", "caller_frame", "frame_variables", "given_ids", "global_names", "left_normally",
           "loop_targets"]

CO_OPTIMIZED = 0x1  # a function's frame: fast locals



_STORES = {"STORE_NAME", "STORE_FAST", "STORE_GLOBAL", "STORE_DEREF", "UNPACK_SEQUENCE", "UNPACK_EX"}



_SKIP_NAMES = {"_", "__", "___"}



NUMBERS = (int, float, bool, type(None))



def left_normally(frame: FrameType | None) -> bool:
    """Whether ``frame`` is leaving its ``for`` loop by ``break`` or ``return`` (not by an
    exception): called while the loop's iterator is being closed.

    CPython pops the iterator with ``POP_TOP`` on a ``break`` or ``return``; while an
    exception unwinds, the frame still points at the instruction that raised.
    """
    if frame is None:
        return False
    try:
        for ins in dis.get_instructions(frame.f_code):
            if ins.offset == frame.f_lasti:
                return ins.opname == "POP_TOP"
    except (TypeError, ValueError):
        pass
    return False



def loop_targets(frame: FrameType) -> set[str]:
    """The names a ``for`` statement at ``frame``'s current ``FOR_ITER`` binds (the loop
    variable, or each name of ``for i, (a, b) in ...``)."""
    names: set[str] = set()
    try:
        found = False
        for ins in dis.get_instructions(frame.f_code):
            if not found:
                found = ins.offset == frame.f_lasti and ins.opname == "FOR_ITER"
                continue
            if ins.opname in ("CACHE", "EXTENDED_ARG"):
                continue
            if ins.opname not in _STORES:
                break
            if ins.opname.startswith("STORE"):
                names.add(ins.argval)
    except (TypeError, ValueError):
        pass
    return names



def skipped_name(name: str) -> bool:
    return name in _SKIP_NAMES or (name.startswith("__") and name.endswith("__"))



def same_key(encoded: Any) -> Any:
    """What two values of a variable compare by: 1, 1.0 and True differ, as do 0.1 and 0.10000001."""
    kind = type(encoded)
    if kind in NUMBERS:
        return kind, encoded
    return kind, json.dumps(encoded, allow_nan=True, separators=(",", ":"))



def maybe_scalar(kind: type) -> bool:
    """Whether values of ``kind`` may be plain data: the containers, NumPy scalars, tensors (0-d ones)."""
    if kind in CONTAINERS or issubclass(kind, LEAF_TYPES):
        return True
    np, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    return bool(np is not None and (issubclass(kind, np.generic) or kind is np.ndarray)
                or torch is not None and issubclass(kind, torch.Tensor))



def scalar_like(value: Any) -> bool:
    """A NumPy scalar or array, or a 0-d tensor (checked without importing either)."""
    np = sys.modules.get("numpy")
    if np is not None and (isinstance(value, np.generic) or type(value) is np.ndarray):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor) and value.dim() == 0



def plain_now(value: Any) -> bool:
    """Data a restore may replace: a scalar, string, list, tuple, dict or ``collections``
    container, a NumPy scalar or numeric array or a 0-d tensor, however long (a history the
    replay grew past ``LIMITS.items`` is still replaced); never a module, function, model or other
    object the script binds the name to now."""
    kind = type(value)
    if kind in SCALARS or kind in CONTAINERS or isinstance(value, LEAF_TYPES):
        return True
    np = sys.modules.get("numpy")
    if np is not None and (isinstance(value, np.generic) or kind is np.ndarray and value.dtype.kind in "biuf"):
        return True
    torch = sys.modules.get("torch")
    try:
        return torch is not None and isinstance(value, torch.Tensor) and value.dim() == 0
    except Exception:  # noqa: BLE001 - an odd tensor subclass: left alone
        return False



def state_like(value: Any) -> bool:
    """Data that a loop may carry (not a module, function, class or method)."""
    return not isinstance(value, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type,
                                  types.MethodType))



def identity_and_size(value: Any) -> tuple[int, int | None]:
    """Identity, and size for the builtin containers and the ``collections`` ones (a ``deque`` of
    recent losses, a ``Counter``); another object's ``__len__`` is not ours to call."""
    return id(value), len(value) if isinstance(value, SIZED) else None



#: containers whose size ``identity_and_size`` reads (subclasses too: Counter, defaultdict, OrderedDict)
SIZED = (list, dict, tuple, set, frozenset, bytearray, collections.deque)



def compare_keys(encoded: dict[str, Any]) -> dict[str, Any]:
    """What each encoded value compares by (``same_key``), to find at ``leave`` what changed."""
    return {name: same_key(value) for name, value in encoded.items()}



def changed_entries(encoded: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``encoded`` that ``before`` (``compare_keys``) lacks or holds another value for."""
    return {name: value for name, value in encoded.items() if name not in before or same_key(value) != before[name]}



_STORED: dict[types.CodeType, frozenset[str]] = {}



def global_names(code: types.CodeType) -> frozenset[str]:
    """The module globals ``code`` assigns (``global step; step += 1``), dunders left out."""
    names = _STORED.get(code)
    if names is None:
        try:
            names = frozenset(i.argval for i in dis.get_instructions(code)
                              if i.opname in ("STORE_GLOBAL", "DELETE_GLOBAL") and not skipped_name(i.argval))
        except Exception:  # noqa: BLE001 - an odd code object: none noted
            names = frozenset()
        _STORED[code] = names
    return names




def holds_state(value: Any) -> bool:
    """A dict, list or tuple (of tensors: a copy of the best weights) or a module (a model's
    copy): what a block may keep outside ``end()``. A bare tensor is not named: a batch
    looked at before the loop and rebound by the block's batch loop is not state."""
    if isinstance(value, (list, tuple, dict)):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.nn.Module)



OWN_TYPES: dict[type, bool] = {}



def own_object(value: Any) -> bool:
    """An instance of a class of the script's own (``__main__``, or a module outside the
    interpreter's and installed packages' folders: a Trainer, a state object, a dataclass), or
    a ``SimpleNamespace`` or argparse ``Namespace``, whose attributes are set plainly: no
    ``__setattr__`` of its own (a model's, a frozen dataclass's), not a class or module."""
    kind = type(value)
    own = OWN_TYPES.get(kind)
    if own is None:
        own = OWN_TYPES[kind] = _own_class(kind)
    return own



def _own_class(kind: type) -> bool:
    try:
        if kind is types.SimpleNamespace or (kind.__module__, kind.__qualname__) == ("argparse", "Namespace"):
            return True  # (SimpleNamespace's __setattr__ is its own slot wrapper, the generic one)
        if issubclass(kind, (type, types.ModuleType, BaseException)) or kind.__setattr__ is not object.__setattr__ \
                or "__dict__" not in dir(kind):
            return False
        module = kind.__module__
        if module == "__main__":
            return True
        if module.split(".")[0] in ("flor", "torch", "numpy"):
            return False
        path = getattr(sys.modules.get(module), "__file__", None)
        if not path:
            return False
        return not os.path.realpath(path).startswith(_library_dirs())
    except Exception:  # noqa: BLE001 - an odd class: not the script's own
        return False



_LIBRARY_DIRS: tuple[str, ...] = ()



def _library_dirs() -> tuple[str, ...]:
    global _LIBRARY_DIRS
    if not _LIBRARY_DIRS:
        import site
        import sysconfig

        paths = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
        try:
            paths.update(site.getsitepackages() + [site.getusersitepackages()])
        except Exception:  # noqa: BLE001 - a virtualenv's old site module
            pass
        _LIBRARY_DIRS = tuple(os.path.join(os.path.realpath(p), "") for p in paths if p)
    return _LIBRARY_DIRS


def caller_frame() -> FrameType | None:
    """The innermost frame outside flor: the script's code that called ``SkipBlock.end``."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__")
        if not (type(name) is str and (name == "flor" or name.startswith("flor."))):
            break
        frame = frame.f_back
    return frame



def frame_variables(frame: FrameType | None) -> dict[str, Any]:
    """The frame's locals over its module's globals (a loop in ``main()`` sees both)."""
    if frame is None:
        return {}
    return {**frame.f_globals, **frame.f_locals}



def given_ids(objs: Iterable[Any]) -> set[int]:
    """Ids of the objects given, and of those one container deep (``end(net, [opt, sched])``)."""
    ids = set()
    for o in objs:
        ids.add(id(o))
        if isinstance(o, (list, tuple)):
            ids.update(id(x) for x in o)
        elif isinstance(o, dict):
            ids.update(id(x) for x in o.values())
    return ids


class PassedIds:
    """The ids of the objects given to ``end()`` in an epoch (``ids``), which ``LoopState`` does not
    name: they are checkpointed. Read only at the epoch's end where the loop's variables are noted
    (``flor.engine.record``); ``clear`` then.

    ``id()`` is an audit event, which ``flor.engine.effects.FileWrites``' hook makes cost ~0.6 us:
    the tuples ``end()`` is given are held, and their ids found only when read or once ``FOLD``
    are held (a block per batch holds at most that many batches), numbers (never named) without.
    A block per iteration, whose epochs are mostly not noted, calls ``id()`` at none of its runs.

    >>> passed, net = PassedIds(), object()
    >>> passed.add((net, 3)); passed.ids == {id(net), 0}
    True
    """

    __slots__ = ("_ids", "_held")
    FOLD = 8

    def __init__(self) -> None:
        self._ids: set[int] = set()
        self._held: list[tuple] = []

    def add(self, objs: tuple) -> None:
        held = self._held
        held.append(objs)
        if len(held) >= self.FOLD:
            self._fold()

    @property
    def ids(self) -> set[int]:
        self._fold()
        return self._ids

    def clear(self) -> None:
        if self._ids:
            self._ids.clear()
        if self._held:
            self._held.clear()

    def _fold(self) -> None:
        ids = self._ids
        for objs in self._held:
            ids.update([0 if type(obj) in NUMBERS else id(obj) for obj in objs])  # 0: no object's id
        self._held.clear()
