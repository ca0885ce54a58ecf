"""Comparing two materialized state trees: where a replay's state differs from the recording's.
"""

from __future__ import annotations

import json
from typing import Any

from ..leaves import LEAF_KINDS
from ..logs import same_value

__all__ = ["diff_nodes", "diff_rng"]


_LEAF_NODES = (*LEAF_KINDS, "torchdtype", "torchdevice", "npdtype")


def _json(node: Any) -> str:
    return json.dumps(node, sort_keys=True, default=str)


def diff_nodes(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths of the leaves where two materialized trees differ (hashes, values or shapes)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.get("t") != b.get("t"):
            return [path or "<root>"]
        if "h" in a or "h" in b:  # a packed leaf's own hash is "x" ("h" names its pack)
            same = a.get("x", a.get("h")) == b.get("x", b.get("h")) \
                and a.get("shape") == b.get("shape") and a.get("dtype") == b.get("dtype")
            return [] if same else [path or "<root>"]
        out: list[str] = []
        if a["t"] in _LEAF_NODES:  # no children: the same JSON is the same value (NaN included)
            return [] if _json(a) == _json(b) else [path or "<root>"]
        if a["t"] in ("set", "frozenset"):
            same = sorted(map(_json, a.get("v", []))) == sorted(map(_json, b.get("v", [])))
            return [] if same else [path or "<root>"]
        if a["t"] in ("namedtuple", "dataclass", "npbitgen") and a.get("cls") != b.get("cls"):
            return [path or "<root>"]
        if a["t"] == "namedtuple" and a.get("k") != b.get("k"):
            return [f"{path}.<fields>"]
        if a.get("maxlen") != b.get("maxlen") or a.get("factory") != b.get("factory"):  # a deque's, a defaultdict's
            return [path or "<root>"]
        if a["t"] in ("dict", "odict", "defaultdict", "object", "stateful", "dataclass") \
                and isinstance(a.get("v"), (dict, list)):
            if a["t"] in ("object", "stateful", "dataclass"):
                return diff_nodes(a["v"], b["v"], path)
            ka, kb = a["k"], b["k"]
            if ka != kb:
                return [f"{path}.<keys>"]
            for k, va, vb in zip(ka, a["v"], b["v"]):
                out += diff_nodes(va, vb, f"{path}.{k}" if path else str(k))
            return out
        if a["t"] in ("list", "tuple", "namedtuple", "deque"):
            if len(a["v"]) != len(b["v"]):
                return [f"{path}.<length>"]
            for i, (va, vb) in enumerate(zip(a["v"], b["v"])):
                out += diff_nodes(va, vb, f"{path}[{i}]")
            return out
        return out + diff_nodes(a.get("v"), b.get("v"), path)
    return [] if same_value(a, b, exact_type=True) else [path or "<root>"]


def diff_rng(recorded: Any, now: Any) -> list[str]:
    """``diff_nodes`` of two materialized random states (``capture_rng``), where a CUDA
    generator that one side has and the other lacks is no difference. A process captures
    CUDA's generators only once CUDA is initialized in it: one that has not initialized it has
    never drawn from them (and a replay's restored CUDA state waits, in torch, until it does),
    while the other may have initialized it for reasons of its own (a library, a hindsight
    log statement computing on the GPU, run metadata); a CPU script's probed replay on a GPU
    machine reported every block diverged.

    >>> node = lambda *keys: {"t": "dict", "k": list(keys), "v": [{"t": "int", "v": 1} for _ in keys]}
    >>> diff_rng(node("python", "numpy", "torch", "cuda"), node("python", "numpy", "torch"))
    []
    >>> diff_nodes(node("python", "numpy", "torch", "cuda"), node("python", "numpy", "torch"))
    ['.<keys>']
    """
    return diff_nodes(*_without_one_sided_cuda(recorded, now))


def _without_one_sided_cuda(a: Any, b: Any) -> tuple[Any, Any]:
    if not (isinstance(a, dict) and isinstance(b, dict) and a.get("t") == b.get("t") == "dict"):
        return a, b
    ka, kb = a.get("k"), b.get("k")
    if not (isinstance(ka, list) and isinstance(kb, list) and isinstance(a.get("v"), list)
            and isinstance(b.get("v"), list)) or set(ka) ^ set(kb) != {"cuda"}:
        return a, b

    def drop(node: dict) -> dict:
        pairs = [(k, v) for k, v in zip(node["k"], node["v"]) if k != "cuda"]
        return {**node, "k": [k for k, _ in pairs], "v": [v for _, v in pairs]}

    return (drop(a), b) if "cuda" in ka else (a, drop(b))
