"""The plain values flor notes outside ``end()``: a JSON form that ``decode`` turns back into an
equal value of the same type, and nothing else (no code runs, nothing is imported).

Numbers, strings, bools, None, NumPy and 0-d tensor scalars, numeric NumPy arrays of up to
``MAX_ARRAY`` values, and small tuples, lists, dicts, deques, Counters, OrderedDicts and
defaultdicts (of list, int, float, dict or str) of them.
"""

from __future__ import annotations

import collections
import math
import sys
from typing import Any

__all__ = ["BLOCK_MAX_ITEMS", "MAX_ARRAY", "MAX_DEPTH", "MAX_ITEMS", "MAX_STR", "NotPlain", "decode", "encode"]

#: the most scalars one variable may hold (all its containers together), and string length
MAX_ITEMS = 256



#: the most values of a NumPy array noted, however many a block's variable may hold: a label
#: array the script loaded (thousands) would be encoded and compared at every block run
MAX_ARRAY = 256



MAX_STR = 4096



MAX_DEPTH = 4



_SCALARS = (int, float, str, bool, type(None))



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



#: the most scalars one variable a block changes may hold (a history of batch losses)
BLOCK_MAX_ITEMS = 4096
