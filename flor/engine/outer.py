"""Outer-loop state: the plain-data variables of the frame that iterates ``flor.it``.

Scripts keep state in the epoch loop itself, outside the objects given to ``SkipBlock.end``:
a best validation loss, a patience counter, an EMA of the loss, a sample counter, a learning
rate set by hand. A replay worker that starts mid-run skips the epochs before its segment,
so without help it would start that state fresh. The recording therefore notes, at the end
of each epoch, the variables of the loop's frame (module globals for a top-level loop, the
function's locals for a loop inside a function) that are plain data: numbers, strings,
bools, None, NumPy and 0-d tensor scalars, numeric NumPy arrays of up to 256 values, and small tuples,
lists, dicts, deques, Counters, OrderedDicts and defaultdicts (of list, int, float, dict or
str) of them. A
worker that starts at epoch ``a > 0`` restores the values noted after epoch ``a - 1`` before
its first epoch runs.

What is not plain data (a list past ``MAX_ITEMS`` items, a dict of tensors, any object) and
was bound before the loop and changed in it is *named* instead: the worker says which
variables it could not restore and how to fix that (pass them to ``end()``, or replay with
``--flor_strong``). Locals of a function are written back with ``PyFrame_LocalsToFast`` up
to Python 3.12 and through the write-through ``frame.f_locals`` of PEP 667 from 3.13;
where neither exists, they are named too.

A variable the loop has not changed by the end of epoch ``a - 1`` (``"unchanged"``: its value
then, and at every epoch end before, is the one it had when the loop started: a timer, a
path, a setting read before the loop) is left as the worker's own code before the loop set
it, as a full re-execution would have it, rather than given the recording's value.

One JSON line per epoch goes to ``logs/outer-state.jsonl``; values are tagged so that a
tuple comes back a tuple and a float32 scalar a float32 scalar. The file is untrusted input
when replayed: a line that does not decode is ignored, a value that does not decode is
named, and nothing in it can run code.
"""

from __future__ import annotations

import collections
import dis
import json
import math
import os
import sys
import types
from pathlib import Path
from types import FrameType
from typing import Any, Collection, Iterable

from .._files import StoreFileError, open_append, read_text

__all__ = ["BlockVars", "LoopFrame", "NotPlain", "OutsideChanges", "OuterStateWriter", "decode", "encode", "global_names", "left_normally",
           "loop_targets", "object_attrs", "read_block_state", "read_outer_state", "restore_attrs", "restore_globals",
           "stored_globals"]

#: the most scalars one variable may hold (all its containers together), and string length
MAX_ITEMS = 256
#: the most values of a NumPy array noted, however many a block's variable may hold: a label
#: array the script loaded (thousands) would be encoded and compared at every block run
MAX_ARRAY = 256
MAX_STR = 4096
MAX_DEPTH = 4
#: the most variables noted per epoch (a notebook's globals can be many)
MAX_VARS = 512

CO_OPTIMIZED = 0x1  # a function's frame: fast locals
_SCALARS = (int, float, str, bool, type(None))
_STORES = {"STORE_NAME", "STORE_FAST", "STORE_GLOBAL", "STORE_DEREF", "UNPACK_SEQUENCE", "UNPACK_EX"}
_SKIP_NAMES = {"_", "__", "___"}
_NUMBERS = (int, float, bool, type(None))
_CONTAINERS = (str, list, tuple, dict, collections.deque, collections.Counter, collections.OrderedDict,
               collections.defaultdict)
#: the factories of a defaultdict that is plain data, by the name its node keeps
_FACTORIES = {"list": list, "int": int, "float": float, "dict": dict, "str": str}
_COLLECTIONS = frozenset((collections.deque, collections.Counter, collections.OrderedDict, collections.defaultdict))


class NotPlain(Exception):
    """The value is not plain data flor can note (or is too big)."""


def encode(value: Any, limit: int = MAX_ITEMS) -> Any:
    """A JSON form of a plain-data ``value`` that ``decode`` turns back into an equal value
    of the same type; raises ``NotPlain`` for anything else or anything over ``limit`` items.

    >>> encode(3), encode((1, "a")), encode({"k": [0.5, None]})
    (3, {'t': [1, 'a']}, {'d': [['k', {'l': [0.5, None]}]]})
    >>> decode(encode((1, {"k": [0.5, True]}))) == (1, {"k": [0.5, True]})
    True
    """
    budget = [limit]
    return _encode(value, budget, 0)


def _encode(value: Any, budget: list[int], depth: int) -> Any:
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        raise NotPlain("too big")
    kind = type(value)
    if kind in _SCALARS:
        if kind is str and len(value) > MAX_STR:
            raise NotPlain("string too long")
        return value
    if kind is list or kind is tuple:
        return {"l" if kind is list else "t": [_encode(v, budget, depth + 1) for v in value]}
    if kind is dict:
        return {"d": [[_encode(k, budget, depth + 1), _encode(v, budget, depth + 1)] for k, v in value.items()]}
    if kind in _COLLECTIONS:
        return _encode_collection(value, kind, budget, depth)
    np = sys.modules.get("numpy")
    if np is not None and kind is np.ndarray:
        if value.dtype.kind not in "biuf" or value.dtype.byteorder == ">" or value.size > MAX_ARRAY \
                or value.size > budget[0] + 1:  # (its node counted one already)
            raise NotPlain("a NumPy array that is not small and numeric")
        budget[0] -= max(value.size - 1, 0)
        return {"nd": value.dtype.str, "s": list(value.shape), "v": value.ravel().tolist()}
    if np is not None and isinstance(value, np.generic) and kind.__module__ == "numpy":
        item = value.item()
        if type(item) not in _SCALARS or isinstance(item, str):
            raise NotPlain("numpy scalar of an odd dtype")
        return {"np": value.dtype.str, "v": item}
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.is_sparse or value.dtype.is_complex:
            raise NotPlain("a tensor that is not a 0-d real scalar")
        return {"pt": str(value.dtype).removeprefix("torch."), "v": value.item(), "dev": str(value.device)}
    raise NotPlain(kind.__name__)


def _encode_collection(value: Any, kind: type, budget: list[int], depth: int) -> Any:
    """A deque (``{"q": items, "m": maxlen}``), Counter (``{"C": pairs}``), OrderedDict
    (``{"od": pairs}``) or defaultdict of a builtin factory (``{"dd": factory, "d": pairs}``)."""
    if kind is collections.deque:
        return {"q": [_encode(v, budget, depth + 1) for v in value], "m": value.maxlen}
    pairs = [[_encode(k, budget, depth + 1), _encode(v, budget, depth + 1)] for k, v in value.items()]
    if kind is collections.defaultdict:
        factory = next((n for n, f in _FACTORIES.items() if f is value.default_factory), None)
        if factory is None:
            raise NotPlain("a defaultdict of another factory")
        return {"dd": factory, "d": pairs}
    return {"C" if kind is collections.Counter else "od": pairs}


def decode(node: Any) -> Any:
    """The value ``encode`` wrote; raises ``ValueError`` on anything it never writes (an int
    too big for its dtype too)."""
    try:
        return _decode(node)
    except (OverflowError, RecursionError) as exc:
        raise ValueError(f"not an encoded value ({exc})") from None


def _decode(node: Any) -> Any:
    if type(node) in _SCALARS:
        return node
    if not isinstance(node, dict) or len(node) not in (1, 2, 3):
        raise ValueError(f"not an encoded value: {node!r:.60}")
    if "l" in node and isinstance(node["l"], list):
        return [_decode(v) for v in node["l"]]
    if "t" in node and isinstance(node["t"], list):
        return tuple(_decode(v) for v in node["t"])
    if "dd" in node and isinstance(node.get("d"), list):
        factory = _FACTORIES.get(node["dd"]) if isinstance(node["dd"], str) else None
        if factory is None:
            raise ValueError(f"not a defaultdict factory flor writes: {node['dd']!r:.40}")
        return _pairs(node["d"], collections.defaultdict(factory))
    if "d" in node and isinstance(node["d"], list):
        return _pairs(node["d"], {})
    if "C" in node and isinstance(node["C"], list):
        return _pairs(node["C"], collections.Counter())
    if "od" in node and isinstance(node["od"], list):
        return _pairs(node["od"], collections.OrderedDict())
    if "q" in node and isinstance(node["q"], list):
        maxlen = node.get("m")
        if maxlen is not None and (type(maxlen) is not int or maxlen < 0):
            raise ValueError(f"not a deque's maxlen: {maxlen!r:.40}")
        return collections.deque((_decode(v) for v in node["q"]), maxlen)
    if "nd" in node and isinstance(node.get("s"), list) and isinstance(node.get("v"), list):
        return _array(node)
    if "np" in node and type(node.get("v")) in (int, float, bool):
        import numpy as np

        dtype = np.dtype(str(node["np"]))
        if dtype.kind not in "biuf":  # what encode writes: booleans, integers, floats
            raise ValueError(f"not a numeric numpy dtype: {node['np']!r:.40}")
        return dtype.type(node["v"])
    if "pt" in node and type(node.get("v")) in (int, float, bool):
        import torch

        dtype = getattr(torch, str(node["pt"]), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown torch dtype {node['pt']!r:.40}")
        device = str(node.get("dev", "cpu"))
        if device != "cpu" and not (device.startswith("cuda") and torch.cuda.is_available()):
            device = "cpu"
        return torch.tensor(node["v"], dtype=dtype, device=device)
    raise ValueError(f"not an encoded value: {node!r:.60}")


def _pairs(pairs: list, out: dict) -> dict:
    """Fill ``out`` from encoded ``[key, value]`` pairs (a key must be hashable plain data)."""
    for pair in pairs:
        if not isinstance(pair, list) or len(pair) != 2:
            raise ValueError("a dict entry is not a [key, value] pair")
        key = _decode(pair[0])
        if not isinstance(key, (int, float, str, bool, tuple, type(None))):
            raise ValueError(f"unhashable dict key {key!r:.60}")
        out[key] = _decode(pair[1])
    return out


def _array(node: dict) -> Any:
    """A NumPy array ``encode`` wrote: a numeric dtype, a shape that holds exactly its values."""
    import numpy as np

    dtype = np.dtype(str(node["nd"]))
    shape, flat = node["s"], node["v"]
    if dtype.kind not in "biuf" or dtype.byteorder == ">":
        raise ValueError(f"not a numeric NumPy dtype: {node['nd']!r:.40}")
    if len(shape) > 32 or not all(type(n) is int and n >= 0 for n in shape) or math.prod(shape) != len(flat) \
            or not all(type(v) in (int, float, bool) for v in flat):
        raise ValueError("a NumPy array's shape does not hold its values")
    return np.array(flat, dtype=dtype).reshape(shape)


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


def _skipped(name: str) -> bool:
    return name in _SKIP_NAMES or (name.startswith("__") and name.endswith("__"))


class LoopFrame:
    """The frame that iterates ``flor.it``: read at epoch boundaries, written back in a replay."""

    def __init__(self, frame: FrameType, limit: int = MAX_ITEMS) -> None:
        self.frame: FrameType | None = frame
        self.limit = limit  # the most scalars one variable may hold
        self.track = True  # name what is not plain data (``_not_plain``); a block's frame does not
        self.function = bool(frame.f_code.co_flags & CO_OPTIMIZED)
        self.where = f"{frame.f_code.co_name}()" if self.function else "the module"
        self.targets: set[str] = set()
        self.before: dict[str, tuple[int, int | None]] = {}  # non-plain variables at the loop's start
        self.changed: set[str] = set()  # ... that the loop rebound or resized
        self.too_many = False
        self.ignored: set[str] = set()  # dunders and the loop variable
        self.static: dict[str, int] = {}  # name -> id of the module, function or class it held at the start
        self.opaque: set[type] = set()  # types that are never plain data (checked once per type)
        self.initial: dict[str, Any] = {}  # plain variables at the loop's start: name -> _same_key(encoded)
        self.touched: set[str] = set()  # ... that some epoch so far ended with another value (or bound anew)

    def variables(self) -> dict[str, Any]:
        frame = self.frame
        if frame is None:
            return {}
        return frame.f_locals if self.function else frame.f_globals

    def start(self, *, loop: bool = True) -> None:
        """At the loop's first step: the loop variable, and the non-plain variables bound
        before the loop (they are state the loop may change). ``loop=False``: at a block's
        entry, which binds no loop variable."""
        if self.frame is None:
            return
        self.targets = loop_targets(self.frame) if loop else set()
        for name, value in list(self.variables().items()):
            if _skipped(name) or name in self.targets:
                self.ignored.add(name)
            elif not _state_like(value):
                self.static[name] = id(value)  # an import, a def: skipped cheaply while it stays
            elif type(value) not in _SCALARS:
                self.before[name] = _fingerprint(value)
        self.ignored |= self.targets
        self.initial = {name: _same_key(v) for name, v in self._plain().items()}

    def capture(self, passed: Iterable[int] = ()) -> dict[str, Any]:
        """``{"vars": {name: encoded}, "unrestorable": [names], "unchanged": [names]}`` of the
        frame now; unchanged: the variables that held their loop-start value at every capture."""
        out = self._plain(passed)
        initial, touched = self.initial, self.touched
        for name, value in out.items():
            if name not in touched and (name not in initial or _same_key(value) != initial[name]):
                touched.add(name)
        return {"vars": out, "unrestorable": sorted(self.changed - out.keys()),
                "unchanged": sorted(name for name in out if name not in touched)}

    def _plain(self, passed: Iterable[int] = (), skip: Collection[int] = ()) -> dict[str, Any]:
        """``{name: encoded}`` of the frame's plain-data variables now, but for the containers
        whose ids are in ``skip`` (given to ``end()``: checkpointed, not encoded here); names the others."""
        out: dict[str, Any] = {}
        passed = set(passed)
        ignored, static = self.ignored, self.static
        for name, value in list(self.variables().items()):
            if name in ignored:
                continue
            kind = type(value)
            if kind in _NUMBERS:  # the common case, without a call
                out[name] = value
                continue
            if static.get(name) == id(value):
                continue
            if kind in self.opaque:  # before the name: most variables are models, tensors, loaders
                if self.track and not _skipped(name):
                    self._not_plain(name, value, passed)
                continue
            if _skipped(name):  # bound inside the loop
                ignored.add(name)
                continue
            if skip and id(value) in skip:
                continue
            if kind not in _CONTAINERS and not _scalar_like(value):
                if not _maybe_scalar(kind):
                    self.opaque.add(kind)  # a model, a loader, a Namespace: never plain data
                self._not_plain(name, value, passed)
                continue
            try:
                out[name] = encode(value, self.limit)
            except NotPlain:
                self._not_plain(name, value, passed)
            except Exception:  # noqa: BLE001 - an odd value (a tensor whose item() fails) is just not noted
                continue
            if len(out) >= MAX_VARS:
                self.too_many = True
                break
        return out

    def _not_plain(self, name: str, value: Any, passed: set[int]) -> None:
        """``name`` holds what cannot be noted: named when it was there before the loop and the
        loop rebound or resized it, or it held plain data then (``best_state = None``, later
        a copy of the weights), and it is not given to ``end()``."""
        if not self.track or id(value) in passed:
            return
        was = self.before.get(name)
        if (was is not None and _fingerprint(value) != was) or name in self.initial:
            self.changed.add(name)

    def restore(self, values: dict[str, Any]) -> list[str]:
        """Write ``values`` into the frame; return the names that could not be written."""
        frame = self.frame
        if frame is None or not values:
            return []
        current = self.variables()
        # a name the script now binds to something that is not plain data is left alone
        values = {k: v for k, v in values.items() if k not in current or _plain_now(current[k])}
        if not self.function:
            frame.f_globals.update(values)
            return []
        code = frame.f_code
        local_names = set(code.co_varnames) | set(code.co_cellvars) | set(code.co_freevars)
        skipped = sorted(k for k in values if k not in local_names)
        values = {k: v for k, v in values.items() if k in local_names}
        if sys.version_info >= (3, 13):  # PEP 667: f_locals writes through
            proxy = frame.f_locals
            for k, v in values.items():
                proxy[k] = v
            return skipped
        try:
            import ctypes

            to_fast = ctypes.pythonapi.PyFrame_LocalsToFast
        except (ImportError, AttributeError):
            return sorted(values) + skipped
        frame.f_locals.update(values)
        to_fast(ctypes.py_object(frame), ctypes.c_int(0))
        return skipped

    def close(self) -> None:
        self.frame = None  # a function's frame keeps its locals alive: let go after the loop


def _same_key(encoded: Any) -> Any:
    """What two values of a variable compare by: 1, 1.0 and True differ, as do 0.1 and 0.10000001."""
    kind = type(encoded)
    if kind in _NUMBERS:
        return kind, encoded
    return kind, json.dumps(encoded, allow_nan=True, separators=(",", ":"))


def _maybe_scalar(kind: type) -> bool:
    """Whether values of ``kind`` may be plain data: the containers, NumPy scalars, tensors (0-d ones)."""
    if kind in _CONTAINERS:
        return True
    np, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    return bool(np is not None and (issubclass(kind, np.generic) or kind is np.ndarray)
                or torch is not None and issubclass(kind, torch.Tensor))


def _scalar_like(value: Any) -> bool:
    """A NumPy scalar or array, or a 0-d tensor (checked without importing either)."""
    np = sys.modules.get("numpy")
    if np is not None and (isinstance(value, np.generic) or type(value) is np.ndarray):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor) and value.dim() == 0


def _plain_now(value: Any) -> bool:
    """Data a restore may replace: a scalar, string, list, tuple, dict or ``collections``
    container, a NumPy scalar or numeric array or a 0-d tensor, however long (a history the
    replay grew past ``MAX_ITEMS`` is still replaced); never a module, function, model or other
    object the script binds the name to now."""
    kind = type(value)
    if kind in _SCALARS or kind in _CONTAINERS:
        return True
    np = sys.modules.get("numpy")
    if np is not None and (isinstance(value, np.generic) or kind is np.ndarray and value.dtype.kind in "biuf"):
        return True
    torch = sys.modules.get("torch")
    try:
        return torch is not None and isinstance(value, torch.Tensor) and value.dim() == 0
    except Exception:  # noqa: BLE001 - an odd tensor subclass: left alone
        return False


def _state_like(value: Any) -> bool:
    """Data that a loop may carry (not a module, function, class or method)."""
    return not isinstance(value, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type,
                                  types.MethodType))


def _fingerprint(value: Any) -> tuple[int, int | None]:
    """Identity, and size for the builtin containers and the ``collections`` ones (a ``deque`` of
    recent losses, a ``Counter``); another object's ``__len__`` is not ours to call."""
    return id(value), len(value) if isinstance(value, _SIZED) else None


#: containers whose size ``_fingerprint`` reads (subclasses too: Counter, defaultdict, OrderedDict)
_SIZED = (list, dict, tuple, set, frozenset, bytearray, collections.deque)


# -- a block's own variables ---------------------------------------------------------------

#: the most scalars one variable a block changes may hold (a history of batch losses)
BLOCK_MAX_ITEMS = 4096


#: the most tensor names one block's ``OutsideChanges`` notes or reads back
MAX_OUTSIDE = 64


class OutsideChanges:
    """In-place changes to the tensors of the modules given to the last ``end()`` that code
    outside the blocks makes before the next ``step_into`` (of any block: another block's
    training or restore is never counted), from their version counters.

    A forward pass in training mode updates BatchNorm's running statistics, a parametrized
    ``spectral_norm`` its power-iteration vectors, and an optimizer step the weights. Done by
    the recorded script between blocks, a replay does it too. Done by a hindsight line only (a
    loss computed on the model left in training mode), a full run of the edited script trains
    on from the changed model, while a replay that restores the next block puts the recording's
    back: its values are the recording's training, not a full run's. The recording notes the
    names each block run found changed, with how many in-place operations changed each
    (``"outside"`` in ``logs/block-state.jsonl``); a replay that finds others, or other counts
    (a hindsight forward besides the script's own), says so. Reading a counter costs no copy: about 1 µs a tensor at ``end()``.
    """

    def __init__(self) -> None:
        self.after: list[tuple[str, Any, int]] = []  # (name, tensor, version) at the last end()

    def ended(self, objs: tuple) -> None:
        """At ``end()``: the version of every parameter and buffer of the modules it is given."""
        torch = sys.modules.get("torch")
        if torch is None:
            return
        try:
            watched = []
            for i, obj in enumerate(objs):
                if isinstance(obj, torch.nn.Module):
                    for part in (obj.named_parameters(), obj.named_buffers()):
                        watched.extend((f"end() object {i}: {path}", t, t._version) for path, t in part)
            self.after = watched
        except Exception:  # noqa: BLE001 - a check, never a reason for training to stop
            self.after = []

    def started(self) -> dict[str, int]:
        """At ``step_into``: ``{tensor: in-place operations}`` since the last ``end()``."""
        watched, self.after = self.after, []
        if not watched:
            return {}
        try:
            return dict(list({path: t._version - version for path, t, version in watched
                              if t._version != version}.items())[:MAX_OUTSIDE])
        except Exception:  # noqa: BLE001 - as above
            return {}


class BlockVars:
    """The plain-data variables a SkipBlock changes outside the objects given to ``end()``.

    A batch loop counts steps (``step += 1``), sums a loss (``total += loss.item()``), appends
    to a history or updates a dict of running metrics, and the code after the block reads them.
    A replay that restores the block does not run its body, so without help those variables
    keep the values they had before it. The recording therefore notes, at each ``end()``, the
    plain-data variables of the block's frame whose value the block changed (or bound anew),
    one JSON line per block run in ``logs/block-state.jsonl``; a replay that restores the block
    sets them as noted (``read_block_state``), so the code after it sees what a full run sees.
    The same for the module globals a block in a function declares ``global``
    (``stored_globals``) and the plain attributes of the script's own objects in the frame that
    ``end()`` is not given (``object_attrs``: ``self.step`` in a Trainer's method).

    Only what the block changed is noted: a variable the edited script sets before the block
    (a setting changed for the hindsight run) is left as the replay's code sets it. Values are
    encoded as for the outer-loop state, at most ``BLOCK_MAX_ITEMS`` scalars a variable; a
    container the block grows past that, or that holds tensors, is still named by the
    recording's warning (``grown_containers``). Never raises into training.
    """

    def __init__(self) -> None:
        self.frames: dict[str, LoopFrame] = {}
        self.noted: dict[str, set[str]] = {}  # block -> the variables noted at one of its ends so far
        self.given: dict[str, set[int]] = {}  # block -> ids of the containers its last end() was given
        self.warned: set[tuple[str, str]] = set()
        self.globals_initial: dict[str, dict[str, Any]] = {}  # block -> its function's globals at entry
        self.attrs_initial: dict[str, dict[str, dict[str, Any]]] = {}  # block -> its objects' attributes at entry
        self.passed: dict[str, set[int]] = {}  # block -> ids of what its last end() was given (``_ids_given``)
        self.attr_ids: dict[str, dict[tuple[str, str], int]] = {}  # block -> its objects' attributes at first entry

    def enter(self, name: str, frame: FrameType | None) -> None:
        """At the block's entry: its frame's plain-data variables, to compare at ``leave``."""
        if frame is None:
            return
        try:
            lf = self.frames.get(name)
            if lf is None:  # its imports, functions and classes are found once and skipped after
                lf = self.frames[name] = LoopFrame(frame, limit=BLOCK_MAX_ITEMS)
                lf.track = False
                lf.start(loop=False)
            else:
                lf.frame = frame  # a block in a function: a new frame each call
                lf.initial = _keys(lf._plain(skip=self.given.get(name, ())))
            variables = lf.variables()
            self.globals_initial[name] = _keys(stored_globals(frame))
            self.attrs_initial[name] = {var: _keys(attrs)
                                        for var, attrs in object_attrs(variables, self.passed.get(name, ())).items()}
            if name not in self.noted:  # its first run: what its objects' attributes are, to name state it rebinds
                self.attr_ids[name] = {(var, attr): id(v) for var, value in variables.items()
                                       if not _skipped(var) and _own_object(value) for attr, v in vars(value).items()}
        except Exception:  # noqa: BLE001 - nothing is noted for this run of the block
            self.frames.pop(name, None)

    def leave(self, name: str, objs: tuple = ()) -> tuple[dict[str, Any], dict[str, Any], list[tuple[str, str]]]:
        """``{variable: encoded}`` of those the block changed since ``enter``, but for a container
        given to ``end()`` (its checkpoint holds it); ``{"globals": ..., "attrs": ...}``, where
        not empty, of the module globals a block in a function changed that the function
        declares ``global`` (``global_step += 1``, ``stored_globals``) and of the plain attributes
        it changed of the script's own objects not given to ``end()`` (``self.step += 1``,
        ``object_attrs``: ``{variable: {attribute: encoded}}``); and, once each, ``(variable, what)`` of
        those it changed that cannot be noted, for a warning: one noted before that no longer
        is (``"too big"``: a history grown past ``BLOCK_MAX_ITEMS``), or one it bound to state
        that is not plain data (``"state"``: a copy of the best weights, in place of a None or
        of an earlier copy). Lets go of the frame."""
        lf = self.frames.get(name)
        if lf is None or lf.frame is None:
            return {}, {}, []
        try:
            initial, now = lf.initial, lf.variables()
            given = self.given[name] = {id(o) for o in objs if type(o) in _CONTAINERS}
            plain = lf._plain(given, skip=given)
            changed = {var: value for var, value in _changed(plain, initial).items() if id(now.get(var)) not in given}
            passed = self.passed[name] = _ids_given(objs)
            was = self.attrs_initial.pop(name, {})
            plain_attrs = object_attrs(now, passed)
            attrs = {var: diff for var, found in plain_attrs.items() if (diff := _changed(found, was.get(var, {})))}
            globals_ = _changed(stored_globals(lf.frame, given), self.globals_initial.pop(name, {}))
            more = {part: found for part, found in (("globals", globals_), ("attrs", attrs)) if found}
            first = name not in self.noted
            noted = self.noted.setdefault(name, set())
            lost = [(var, "too big" if var in noted else "state") for var in sorted((noted | initial.keys()) - plain.keys())
                    if var in now and (var in noted or _holds_state(now[var]))]
            if first:  # state bound before the block, rebound by its first run: a copy of the best weights
                lost += [(var, "state") for var, (ident, _) in sorted(lf.before.items())
                         if var in now and id(now[var]) != ident and var not in plain and _holds_state(now[var])]
                ids = self.attr_ids.pop(name, {})  # ... or kept on self: self.best_state
                lost += [(f"{var}.{attr}", "state") for var, value in sorted(now.items())
                         if id(value) not in passed and not _skipped(var) and _own_object(value)
                         for attr, v in sorted(vars(value).items())
                         if ids.get((var, attr)) != id(v) and attr not in plain_attrs.get(var, {})
                         and id(v) not in passed and _holds_state(v)]
            lost = [(var, what) for var, what in lost
                    if (name, var) not in self.warned and ("." in var or (id(now[var]) not in passed and not _skipped(var)))]
            self.warned.update((name, var) for var, _ in lost)
            noted.update(changed)
            return changed, more, lost
        except Exception:  # noqa: BLE001 - nothing is noted for this run of the block
            return {}, {}, []
        finally:
            lf.frame = None


def _keys(encoded: dict[str, Any]) -> dict[str, Any]:
    """What each encoded value compares by (``_same_key``), to find at ``leave`` what changed."""
    return {name: _same_key(value) for name, value in encoded.items()}


def _changed(encoded: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``encoded`` that ``before`` (``_keys``) lacks or holds another value for."""
    return {name: value for name, value in encoded.items() if name not in before or _same_key(value) != before[name]}


_STORED: dict[types.CodeType, frozenset[str]] = {}


def global_names(code: types.CodeType) -> frozenset[str]:
    """The module globals ``code`` assigns (``global step; step += 1``), dunders left out."""
    names = _STORED.get(code)
    if names is None:
        try:
            names = frozenset(i.argval for i in dis.get_instructions(code)
                              if i.opname in ("STORE_GLOBAL", "DELETE_GLOBAL") and not _skipped(i.argval))
        except Exception:  # noqa: BLE001 - an odd code object: none noted
            names = frozenset()
        _STORED[code] = names
    return names


def stored_globals(frame: FrameType, skip: Collection[int] = ()) -> dict[str, Any]:
    """``{name: encoded}`` of the plain-data module globals a function's frame assigns
    (``global_names``), but for the containers whose ids are in ``skip``; empty for a module's
    frame, whose globals are its variables."""
    if not frame.f_code.co_flags & CO_OPTIMIZED:
        return {}
    module, out = frame.f_globals, {}
    for var in global_names(frame.f_code):
        if var in module and id(module[var]) not in skip:
            try:
                out[var] = encode(module[var], BLOCK_MAX_ITEMS)
            except Exception:  # noqa: BLE001 - NotPlain, or an odd value: not noted
                continue
    return out


def _ids_given(objs: tuple) -> set[int]:
    """Ids of the objects given to ``end()`` and of those one container deep."""
    ids = {id(o) for o in objs}
    for o in objs:
        if isinstance(o, (list, tuple)):
            ids.update(id(x) for x in o)
        elif isinstance(o, dict):
            ids.update(id(x) for x in o.values())
    return ids


def _holds_state(value: Any) -> bool:
    """A dict, list or tuple (of tensors: a copy of the best weights) or a module (a model's
    copy): what a block may keep outside ``end()``. A bare tensor is not named: a batch
    looked at before the loop and rebound by the block's batch loop is not state."""
    if isinstance(value, (list, tuple, dict)):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.nn.Module)


_OWN: dict[type, bool] = {}


def _own_object(value: Any) -> bool:
    """An instance of a class of the script's own (``__main__``, or a module outside the
    interpreter's and installed packages' folders: a Trainer, a state object, a dataclass), or
    a ``SimpleNamespace`` or argparse ``Namespace``, whose attributes are set plainly: no
    ``__setattr__`` of its own (a model's, a frozen dataclass's), not a class or module."""
    kind = type(value)
    own = _OWN.get(kind)
    if own is None:
        own = _OWN[kind] = _own_class(kind)
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
        return bool(path) and not os.path.realpath(path).startswith(_library_dirs())
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


#: how deep ``object_attrs`` looks: ``self.step`` and ``self.state.global_step``
ATTR_DEPTH = 2


def object_attrs(variables: dict[str, Any], skip: Collection[int] = ()) -> dict[str, dict[str, Any]]:
    """``{variable: {attribute: encoded}}`` of the plain-data attributes of the script's own
    objects among ``variables`` (``_own_object``: ``self`` in a Trainer's method), and of such
    objects they hold (``"state.global_step"``, ``ATTR_DEPTH`` names deep), but for those whose
    ids are in ``skip`` (given to ``end()``: checkpointed whole)."""
    out: dict[str, dict[str, Any]] = {}
    for var, value in variables.items():
        own = _OWN.get(type(value))  # most variables are models, tensors, functions: one lookup
        if own is False or id(value) in skip or not (own or _own_object(value)) or _skipped(var):
            continue
        attrs: dict[str, Any] = {}
        _plain_attrs(value, "", skip, attrs, 1)
        if attrs:
            out[var] = attrs
    return out


def _plain_attrs(obj: Any, prefix: str, skip: Collection[int], out: dict[str, Any], depth: int) -> None:
    for attr, v in list(vars(obj).items()):
        if type(attr) is not str or not attr.isidentifier() or _skipped(attr) or id(v) in skip:
            continue
        own = _OWN.get(type(v))
        if own is not False and (own or _own_object(v)):  # an object of the script's own in an attribute
            if depth < ATTR_DEPTH:
                _plain_attrs(v, f"{prefix}{attr}.", skip, out, depth + 1)
            continue
        try:
            out[prefix + attr] = encode(v, BLOCK_MAX_ITEMS)
        except Exception:  # noqa: BLE001 - NotPlain, or an odd value: not noted
            continue


def restore_attrs(variables: dict[str, Any], values: dict[str, dict[str, Any]]) -> list[str]:
    """Set ``{variable: {attribute: value}}`` (an attribute a dotted path through objects of
    the script's own, ``"state.global_step"``) on the script's own objects the variables hold
    now (``_own_object``), only where the attribute holds plain data or nothing now and the
    class has no descriptor for it (a property's setter is never run); return the
    ``variable.attribute`` names left as they are."""
    left = []
    for var, attrs in values.items():
        for path, value in attrs.items():
            obj, *parts = [variables.get(var), *path.split(".")]
            for part in parts[:-1]:  # through the script's own objects only, never a property
                obj = vars(obj).get(part) if obj is not None and _own_object(obj) else None
            attr = parts[-1]
            if obj is None or not _own_object(obj) or len(parts) > ATTR_DEPTH:
                left.append(f"{var}.{path}")
                continue
            own = vars(obj)
            if (attr in own and not _plain_now(own[attr])) \
                    or (hasattr(type(obj), attr) and not _plain_now(getattr(type(obj), attr))):  # a method, property
                left.append(f"{var}.{path}")
            else:
                own[attr] = value
    return sorted(left)


def restore_globals(frame: FrameType, values: dict[str, Any]) -> list[str]:
    """Set the module globals in ``values`` that the function of ``frame`` assigns itself
    (``global_names``; values from a store never bind another name) and that hold plain data or
    nothing now; return the names left as they are."""
    allowed = global_names(frame.f_code) if frame.f_code.co_flags & CO_OPTIMIZED else frozenset()
    module, left = frame.f_globals, []
    for var, value in values.items():
        if var in allowed and (var not in module or _plain_now(module[var])):
            module[var] = value
        else:
            left.append(var)
    return sorted(left)


def read_block_state(path: Path) -> dict[tuple[int | None, str, int], dict[str, dict[str, Any]]]:
    """``{(epoch, block, occurrence): {"vars": {variable: encoded}, "globals": {...}, "attrs":
    {variable: {attribute: encoded}}}}`` noted by ``BlockVars`` (``globals``: those of the module
    a block in a function declares ``global``; ``attrs``: of the script's own objects); empty
    when there is none. Untrusted input: a line of another shape is ignored,
    and only names that are identifiers (not dunders) are kept, so what a restore writes is
    plain data under a plain name."""
    try:
        lines = read_text(path).splitlines()  # a regular file of at most MAX_METADATA, no link followed
    except StoreFileError as exc:
        from ..errors import warn

        warn(f"ignoring {exc.strerror}")
        return {}
    except OSError:
        return {}
    found: dict[tuple[int | None, str, int], dict[str, dict[str, Any]]] = {}
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        epoch, block, occ = rec.get("epoch"), rec.get("block"), rec.get("occ")
        got, module, attrs = rec.get("vars", {}), rec.get("globals", {}), rec.get("attrs", {})
        if (epoch is not None and type(epoch) is not int) or type(block) is not str or type(occ) is not int \
                or not isinstance(got, dict) or not isinstance(module, dict) or not isinstance(attrs, dict):
            continue
        entry = {part: _named(names) for part, names in (("vars", got), ("globals", module))}
        entry["attrs"] = {var: {k: v for k, v in names.items() if _attr_path(k)}
                          for var, names in _named(attrs).items() if isinstance(names, dict)}
        outside = rec.get("outside", {})  # names and counts: compared, never acted on
        entry["outside"] = {k: v for k, v in list(outside.items())[:MAX_OUTSIDE]
                            if isinstance(k, str) and len(k) <= 400 and type(v) is int} \
            if isinstance(outside, dict) else {}
        found[(epoch, block, occ)] = entry
    return found  # the last line of a key wins (a resumed recording appends again)


def _attr_path(key: Any) -> bool:
    """``key`` is an attribute, or a dotted path of at most ``ATTR_DEPTH`` attributes, each an
    identifier that is not a dunder."""
    parts = key.split(".") if isinstance(key, str) else []
    return 0 < len(parts) <= ATTR_DEPTH and all(p.isidentifier() and not _skipped(p) for p in parts)


def _named(names: dict) -> dict[str, Any]:
    """The entries of ``names`` under identifiers that are not dunders."""
    return {k: v for k, v in names.items() if isinstance(k, str) and k.isidentifier() and not _skipped(k)}


# -- the file ------------------------------------------------------------------------------


class OuterStateWriter:
    """Appends one line per epoch; never raises into training."""

    def __init__(self, path: Path, what: str = "the outer-loop state") -> None:
        self.path, self.what = path, what
        self._file: Any = None
        self.failed: str | None = None

    def write(self, epoch: int, state: dict[str, Any]) -> None:
        if self.failed is not None:
            return
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = os.fdopen(open_append(self.path), "a", encoding="utf-8")  # never through a link
            self._file.write(json.dumps({"epoch": epoch, **state}, separators=(",", ":"), allow_nan=True) + "\n")
            self._file.flush()
        except (OSError, ValueError, TypeError) as exc:
            self.failed = str(exc)
            from ..errors import warn

            warn(f"writing {self.what} to {self.path} failed ({exc}); a replay will name the variables "
                 "it cannot restore")

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None


def read_outer_state(path: Path, epoch: int) -> dict[str, Any] | None:
    """The state noted at the end of ``epoch`` (``{"vars": ..., "unrestorable": [...]}``,
    values still encoded), or None when there is none or its line is damaged."""
    try:
        lines = read_text(path).splitlines()  # a regular file of at most MAX_METADATA, no link followed
    except StoreFileError as exc:  # a FIFO, a link, a huge file in its place: as if nothing was noted
        from ..errors import warn

        warn(f"ignoring {exc.strerror}")
        return None
    except OSError:
        return None
    found = None
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("epoch") == epoch and isinstance(rec.get("vars"), dict):
            found = rec  # the last one wins (a resumed recording appends again)
    if found is None:
        return None
    unrestorable = found.get("unrestorable")
    found["unrestorable"] = [str(n) for n in unrestorable] if isinstance(unrestorable, list) else []
    unchanged = found.get("unchanged")  # absent in a recording of an older flor: every variable is restored
    found["unchanged"] = [n for n in unchanged if isinstance(n, str)] if isinstance(unchanged, list) else []
    return found
