"""The plain values flor notes outside ``end()``, in the state codec's vocabulary.

Numbers, strings, bools and None stand for themselves; everything else is a node ``{"t": kind,
...}`` named as ``flor.state`` names it in a manifest: ``list``, ``tuple``, ``dict``/``odict``
(``"k"`` keys, ``"v"`` values), ``deque`` (``"maxlen"``), ``defaultdict`` (``"factory"``, one of
``flor.store.manifest.DEFAULT_FACTORIES``), ``set``/``frozenset``, ``npscalar`` (``"dtype"``), the
leaves of ``flor.leaves`` (complex, paths, dates and times, decimals, UUIDs, enums); and, held
inline where a manifest points at a blob, ``ndarray`` and 0-d ``tensor`` (``"v"``: the values),
and ``counter``. ``decode`` turns a node back into an equal value of the same type and nothing
else: no code runs, nothing is imported, and a damaged node is a ``ValueError`` (the replay
names the variable it cannot set).

Only small values are plain (``flor.watch.limits``): numeric NumPy arrays of at most
``LIMITS.array`` values, at most ``limit`` scalars in all, ``LIMITS.depth`` containers deep.

>>> encode(3), encode((1, "a")), encode({"k": [0.5, None]})
(3, {'t': 'tuple', 'v': [1, 'a']}, {'t': 'dict', 'k': ['k'], 'v': [{'t': 'list', 'v': [0.5, None]}]})
>>> decode(encode((1, {"k": [0.5, True]}))) == (1, {"k": [0.5, True]})
True
"""

from __future__ import annotations

import collections
import math
import sys
from typing import Any

from ..errors import StateError
from ..leaves import LEAF_KINDS, decode_leaf, encode_leaf
from ..store.manifest import DEFAULT_FACTORIES
from .limits import LIMITS

__all__ = ["LEAF_TYPES", "NotPlain", "decode", "encode"]

SCALARS = (int, float, str, bool, type(None))
CONTAINERS = (str, list, tuple, dict, set, frozenset, collections.deque, collections.Counter,
               collections.OrderedDict, collections.defaultdict)
_SEQUENCES: dict[type, str] = {list: "list", tuple: "tuple", set: "set", frozenset: "frozenset"}
_MAPPINGS: dict[type, str] = {dict: "dict", collections.OrderedDict: "odict", collections.Counter: "counter"}


def _leaf_types() -> tuple[type, ...]:
    import datetime as dt
    import decimal
    import enum
    import pathlib
    import uuid

    return (complex, pathlib.PurePath, dt.datetime, dt.date, dt.time, dt.timedelta, decimal.Decimal, uuid.UUID,
            enum.Enum)


#: the types of ``flor.leaves``' plain leaves (enums and paths by subclass)
LEAF_TYPES = _leaf_types()


class NotPlain(Exception):
    """The value is not plain data flor can note (or is too big)."""


def encode(value: Any, limit: int = LIMITS.items) -> Any:
    """The node of a plain-data ``value`` that ``decode`` turns back into an equal value of the
    same type; ``NotPlain`` for anything else or anything over ``limit`` scalars."""
    return _encode(value, [limit], 0)


def _encode(value: Any, budget: list[int], depth: int) -> Any:
    budget[0] -= 1
    if budget[0] < 0 or depth > LIMITS.depth:
        raise NotPlain("too big")
    kind = type(value)
    if kind in SCALARS:
        if kind is str and len(value) > LIMITS.string:
            raise NotPlain("string too long")
        return value
    name = _SEQUENCES.get(kind)
    if name is not None:
        items = value if name in ("list", "tuple") else sorted(value, key=_order)
        return {"t": name, "v": [_encode(v, budget, depth + 1) for v in items]}
    if kind is collections.deque:
        return {"t": "deque", "maxlen": value.maxlen, "v": [_encode(v, budget, depth + 1) for v in value]}
    name = _MAPPINGS.get(kind)
    if name is not None:
        return {"t": name, **_pairs(value, budget, depth)}
    if kind is collections.defaultdict:
        factory = next((n for n, f in DEFAULT_FACTORIES.items() if f is value.default_factory), False)
        if factory is False:
            raise NotPlain("a defaultdict of another factory")
        return {"t": "defaultdict", "factory": factory, **_pairs(value, budget, depth)}
    np = sys.modules.get("numpy")
    if np is not None and kind is np.ndarray:
        if value.dtype.kind not in "biuf" or value.dtype.byteorder == ">" or value.size > LIMITS.array \
                or value.size > budget[0] + 1:  # (its node counted one already)
            raise NotPlain("a NumPy array that is not small and numeric")
        budget[0] -= max(value.size - 1, 0)
        return {"t": "ndarray", "dtype": value.dtype.str, "shape": list(value.shape), "v": value.ravel().tolist()}
    if np is not None and isinstance(value, np.generic) and kind.__module__ == "numpy":
        item = value.item()
        if type(item) not in SCALARS or isinstance(item, str) or value.dtype.kind not in "biuf":
            raise NotPlain("numpy scalar of an odd dtype")
        return {"t": "npscalar", "dtype": value.dtype.str, "v": item}
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.is_sparse or value.dtype.is_complex:
            raise NotPlain("a tensor that is not a 0-d real scalar")
        return {"t": "tensor", "dtype": str(value.dtype).removeprefix("torch."), "shape": [],
                "device": str(value.device), "v": value.item()}
    leaf = encode_leaf(value) if isinstance(value, LEAF_TYPES) else None
    if leaf is None:
        raise NotPlain(kind.__name__)
    return leaf


def _pairs(value: Any, budget: list[int], depth: int) -> dict[str, list]:
    keys, values = [], []
    for k, v in value.items():
        keys.append(_encode(k, budget, depth + 1))
        values.append(_encode(v, budget, depth + 1))
    return {"k": keys, "v": values}


def _order(item: Any) -> tuple[str, str]:
    """A set's members in the same order in every process (as ``flor.leaves.sort_key``)."""
    return type(item).__qualname__, repr(item)


def decode(node: Any) -> Any:
    """The value ``encode`` wrote; ``ValueError`` on anything it never writes (an int too big
    for its dtype, a shape its values do not fill, an unhashable key, a factory by another name)."""
    try:
        return _decode(node, 0)
    except (OverflowError, RecursionError, TypeError, KeyError, IndexError, AttributeError, StateError) as exc:
        raise ValueError(f"not an encoded value ({exc})") from None


def _decode(node: Any, depth: int) -> Any:
    if type(node) in SCALARS:
        return node
    if not isinstance(node, dict) or not isinstance(node.get("t"), str) or depth > LIMITS.depth + 1:
        raise ValueError(f"not an encoded value: {node!r:.60}")
    kind, v = node["t"], node.get("v")
    if kind in ("list", "tuple", "set", "frozenset", "deque") and isinstance(v, list):
        items = [_decode(x, depth + 1) for x in v]
        if kind == "deque":
            maxlen = node.get("maxlen")
            if maxlen is not None and (type(maxlen) is not int or maxlen < 0):
                raise ValueError(f"not a deque's maxlen: {maxlen!r:.40}")
            return collections.deque(items, maxlen)
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[kind](items)
    if kind in ("dict", "odict", "counter", "defaultdict") and isinstance(v, list) \
            and isinstance(node.get("k"), list) and len(node["k"]) == len(v):
        if kind == "defaultdict":
            factory = node.get("factory")
            if not (factory is None or isinstance(factory, str)) or factory not in DEFAULT_FACTORIES:
                raise ValueError(f"not a defaultdict factory flor writes: {factory!r:.40}")
            out: dict = collections.defaultdict(DEFAULT_FACTORIES[factory])
        else:
            out = {"dict": dict, "odict": collections.OrderedDict, "counter": collections.Counter}[kind]()
        for k, x in zip(node["k"], v):
            key = _decode(k, depth + 1)
            if isinstance(key, (list, dict, set, collections.deque)):
                raise ValueError(f"unhashable dict key {key!r:.60}")
            out[key] = _decode(x, depth + 1)
        return out
    if kind == "ndarray" and isinstance(v, list):
        return _array(node)
    if kind == "npscalar" and type(v) in (int, float, bool):
        import numpy as np

        dtype = np.dtype(str(node.get("dtype")))
        if dtype.kind not in "biuf":  # what encode writes: booleans, integers, floats
            raise ValueError(f"not a numeric numpy dtype: {node.get('dtype')!r:.40}")
        return dtype.type(v)
    if kind == "tensor" and type(v) in (int, float, bool) and node.get("shape") == []:
        import torch

        torch_dtype = getattr(torch, str(node.get("dtype")), None)
        if not isinstance(torch_dtype, torch.dtype):
            raise ValueError(f"unknown torch dtype {node.get('dtype')!r:.40}")
        device = str(node.get("device", "cpu"))
        if device != "cpu" and not (device.startswith("cuda") and torch.cuda.is_available()):
            device = "cpu"
        return torch.tensor(v, dtype=torch_dtype, device=device)
    if kind in LEAF_KINDS:
        return decode_leaf(node, None, "a noted value")
    raise ValueError(f"not an encoded value: {node!r:.60}")


def _array(node: dict) -> Any:
    """A NumPy array ``encode`` wrote: a numeric dtype, a shape that holds exactly its values."""
    import numpy as np

    dtype = np.dtype(str(node.get("dtype")))
    shape, flat = node.get("shape"), node["v"]
    if dtype.kind not in "biuf" or dtype.byteorder == ">":
        raise ValueError(f"not a numeric NumPy dtype: {node.get('dtype')!r:.40}")
    if not isinstance(shape, list) or len(shape) > 32 or not all(type(n) is int and n >= 0 for n in shape) \
            or math.prod(shape) != len(flat) or not all(type(x) in (int, float, bool) for x in flat):
        raise ValueError("a NumPy array's shape does not hold its values")
    return np.array(flat, dtype=dtype).reshape(shape)
