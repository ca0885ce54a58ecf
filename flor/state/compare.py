"""Comparing two materialized state trees: where a replay's state differs from the recording's.
"""

from __future__ import annotations

import json
from typing import Any, Callable

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
                and a.get("shape") == b.get("shape") and a.get("dtype") == b.get("dtype") \
                and a.get("stride") == b.get("stride")
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
                if a.get("frozen") != b.get("frozen"):  # which parameters require grad (a module's)
                    out.append(f"{path}.<requires_grad>" if path else "<requires_grad>")
                if a.get("eval") != b.get("eval"):  # train/eval mode (a module's)
                    out.append(f"{path}.<training>" if path else "<training>")
                if "aux" in a or "aux" in b:  # a module's tensors outside its state_dict
                    out += diff_nodes(a.get("aux"), b.get("aux"), f"{path}.<aux>" if path else "<aux>")
                return out + diff_nodes(a["v"], b["v"], path)
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


def diff_rng(recorded: Any, now: Any, undrawn: Callable[[int, int], bool] | None = None) -> list[str]:
    """``diff_nodes`` of two materialized random states (``capture_rng``), where a CUDA
    generator that one side has and the other lacks is no difference. A process captures
    CUDA's generators only once CUDA is initialized in it: one that has not initialized it has
    never drawn from them (and a replay's restored CUDA state waits, in torch, until it does),
    while the other may have initialized it for reasons of its own (a library, a hindsight
    log statement computing on the GPU, run metadata); a CPU script's probed replay on a GPU
    machine reported every block diverged.

    Where both hold CUDA generators for different numbers of devices (recorded where the
    process saw 8 GPUs, replayed by a worker that sees one), the devices both have compare,
    and the others are no difference if ``undrawn(recorded_count, now_count)`` says nothing
    drew from them on either side (``flor.state.rng.cuda_undrawn``); without it, they are.

    >>> node = lambda *keys: {"t": "dict", "k": list(keys), "v": [{"t": "int", "v": 1} for _ in keys]}
    >>> diff_rng(node("python", "numpy", "torch", "cuda"), node("python", "numpy", "torch"))
    []
    >>> diff_nodes(node("python", "numpy", "torch", "cuda"), node("python", "numpy", "torch"))
    ['.<keys>']
    >>> devices = lambda n: {"t": "dict", "k": ["cuda"], "v": [{"t": "list", "v": [{"t": "int", "v": 1}] * n}]}
    >>> diff_rng(devices(4), devices(1)), diff_rng(devices(4), devices(1), lambda r, n: True)
    (['cuda.<devices>'], [])
    """
    a, b = _without_one_sided_cuda(recorded, now)
    a, b, counts = _common_cuda_devices(a, b)
    out = diff_nodes(a, b)
    if counts is not None and not (undrawn is not None and undrawn(*counts)):
        out.append("cuda.<devices>")
    return out


def _common_cuda_devices(a: Any, b: Any) -> tuple[Any, Any, tuple[int, int] | None]:
    """Both trees with their CUDA generator lists cut to the devices both have, and the two
    device counts where they differ (else None)."""
    def cuda_list(node: Any) -> Any:
        if isinstance(node, dict) and node.get("t") == "dict" and isinstance(node.get("k"), list) \
                and isinstance(node.get("v"), list) and "cuda" in node["k"]:
            found = node["v"][node["k"].index("cuda")]
            if isinstance(found, dict) and found.get("t") in ("list", "tuple") and isinstance(found.get("v"), list):
                return found
        return None

    ca, cb = cuda_list(a), cuda_list(b)
    if ca is None or cb is None or len(ca["v"]) == len(cb["v"]):
        return a, b, None
    n = min(len(ca["v"]), len(cb["v"]))

    def cut(node: dict, devices: dict) -> dict:
        i = node["k"].index("cuda")
        return {**node, "v": [*node["v"][:i], {**devices, "v": devices["v"][:n]}, *node["v"][i + 1:]]}

    return cut(a, ca), cut(b, cb), (len(ca["v"]), len(cb["v"]))


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
