"""What the objects given to ``SkipBlock.end`` are, by type, for the messages about them."""

from __future__ import annotations

from difflib import SequenceMatcher
from typing import Any

__all__ = ["arity_message", "article", "describe", "describe_node"]

def describe(obj: Any) -> str:
    """A type as the manifest names it: ``torch.optim.adamw.AdamW``, ``int``, ``tensor``..."""
    import numpy as np
    import torch

    if isinstance(obj, torch.Tensor):
        return "tensor"
    if isinstance(obj, np.ndarray):
        return "numpy array"
    if isinstance(obj, np.generic):
        return "numpy scalar"
    cls = type(obj)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"



def describe_node(node: Any) -> str:
    """The same name for a recorded object, from its manifest node (see :mod:`flor.state`)."""
    if not isinstance(node, dict):
        return type(node).__name__
    kind = node.get("t")
    if "cls" in node and kind != "pickle":
        return str(node["cls"])
    return {"tensor": "tensor", "ndarray": "numpy array", "npscalar": "numpy scalar", "odict": "OrderedDict",
            "pyrandom": "random.Random", "nprandomstate": "numpy.random.RandomState",
            "npgenerator": "numpy.random.Generator", "generator": "torch._C.Generator"}.get(
        str(kind), str(node.get("cls") or kind))



def article(kind: str) -> str:
    return f"an {kind}" if kind[:1].lower() in "aeiou" else f"a {kind}"



def arity_message(name: str, epoch: int | None, recorded: list[Any], given: tuple) -> str:
    """Why ``end()`` does not fit its checkpoint: which positions are missing or extra, by type.

    >>> import torch
    >>> recorded = [{"t": "stateful", "cls": "torch.nn.modules.linear.Linear"}, 3,
    ...             {"t": "stateful", "cls": "torch.optim.lr_scheduler.StepLR"}]
    >>> print(arity_message("train", 0, recorded, (torch.nn.Linear(2, 1), 4)))
    SkipBlock.end('train') was given 2 objects at epoch 0, the recording had 3: position 2 was a torch.optim.lr_scheduler.StepLR (missing now); pass the same objects, in the same order
    """  # noqa: E501 - a doctest's expected output is one line
    old = [describe_node(n) for n in recorded]
    new = [describe(o) for o in given]
    where = "" if epoch is None else f" at epoch {epoch}"
    parts: list[str] = []
    for tag, i1, i2, j1, j2 in SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag == "replace" and i2 - i1 == j2 - j1:  # the same count, other types
            parts.extend(f"position {i} was {article(old[i])}, is {article(new[j])} now"
                         for i, j in zip(range(i1, i2), range(j1, j2)))
            continue
        if tag in ("delete", "replace"):
            parts.extend(f"position {i} was {article(old[i])} (missing now)" for i in range(i1, i2))
        if tag in ("insert", "replace"):
            parts.extend(f"position {j} is {article(new[j])} (not in the recording)" for j in range(j1, j2))
    detail = "; ".join(parts[:6]) + ("; ..." if len(parts) > 6 else "")
    return (f"SkipBlock.end({name!r}) was given {len(given)} objects{where}, the recording had {len(recorded)}"
            + (f": {detail}" if detail else "") + "; pass the same objects, in the same order")
