"""What the objects given to ``SkipBlock.end`` are, for the messages about them.

Two mistakes are easy to make and costly to find later:

- an optimizer is given but its LR scheduler or GradScaler is not, so their state is not
  checkpointed and a replay that restores the block starts them fresh. ``forgotten`` finds
  them, once per block, among the variables of the frame that calls ``end()``;
- on replay, ``end()`` gets other objects than the recording did. ``arity_message`` says
  which are missing or extra, by position and type, from the classes the manifest kept.

>>> import torch
>>> net = torch.nn.Linear(2, 1)
>>> opt = torch.optim.SGD(net.parameters(), lr=0.1)
>>> sched = torch.optim.lr_scheduler.StepLR(opt, 1)
>>> [(name, kind) for name, kind, _ in forgotten((net, opt), {"net": net, "opt": opt, "sched": sched})]
[('sched', 'torch.optim.lr_scheduler.StepLR')]
>>> forgotten((net, opt, sched), {"net": net, "opt": opt, "sched": sched})
[]
"""

from __future__ import annotations

import sys
from difflib import SequenceMatcher
from types import FrameType
from typing import Any, Iterable, Mapping

__all__ = ["arity_message", "caller_frame", "describe", "describe_node", "forgotten"]

_PLAIN = (bool, int, float, complex, str, bytes, type(None))


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


def _a(kind: str) -> str:
    return f"an {kind}" if kind[:1].lower() in "aeiou" else f"a {kind}"


def arity_message(name: str, epoch: int | None, recorded: list[Any], given: tuple) -> str:
    """Why ``end()`` does not fit its checkpoint: which positions are missing or extra, by type.

    >>> import torch
    >>> recorded = [{"t": "stateful", "cls": "torch.nn.modules.linear.Linear"}, 3,
    ...             {"t": "stateful", "cls": "torch.optim.lr_scheduler.StepLR"}]
    >>> print(arity_message("train", 0, recorded, (torch.nn.Linear(2, 1), 4)))
    SkipBlock.end('train') was given 2 objects at epoch 0, the recording had 3: position 2 was a torch.optim.lr_scheduler.StepLR (missing now); pass the same objects, in the same order
    """
    old = [describe_node(n) for n in recorded]
    new = [describe(o) for o in given]
    where = "" if epoch is None else f" at epoch {epoch}"
    parts = []
    for tag, i1, i2, j1, j2 in SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag == "replace" and i2 - i1 == j2 - j1:  # the same count, other types
            parts.extend(f"position {i} was {_a(old[i])}, is {_a(new[j])} now" for i, j in zip(range(i1, i2), range(j1, j2)))
            continue
        if tag in ("delete", "replace"):
            parts.extend(f"position {i} was {_a(old[i])} (missing now)" for i in range(i1, i2))
        if tag in ("insert", "replace"):
            parts.extend(f"position {j} is {_a(new[j])} (not in the recording)" for j in range(j1, j2))
    detail = "; ".join(parts[:6]) + ("; ..." if len(parts) > 6 else "")
    return (f"SkipBlock.end({name!r}) was given {len(given)} objects{where}, the recording had {len(recorded)}"
            + (f": {detail}" if detail else "") + "; pass the same objects, in the same order")


def caller_frame() -> FrameType | None:
    """The innermost frame outside flor: the script's code that called ``SkipBlock.end``."""
    frame = sys._getframe(1)
    while frame is not None and str(frame.f_globals.get("__name__", "")).split(".")[0] == "flor":
        frame = frame.f_back
    return frame


def frame_variables(frame: FrameType | None) -> dict[str, Any]:
    """The frame's locals over its module's globals (a loop in ``main()`` sees both)."""
    if frame is None:
        return {}
    return {**frame.f_globals, **frame.f_locals}


def _passed(objs: Iterable[Any]) -> set[int]:
    """Ids of the objects given, and of those one container deep (``end(net, [opt, sched])``)."""
    ids = set()
    for o in objs:
        ids.add(id(o))
        if isinstance(o, (list, tuple)):
            ids.update(id(x) for x in o)
        elif isinstance(o, dict):
            ids.update(id(x) for x in o.values())
    return ids


def forgotten(objs: tuple, variables: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """``(variable, type, why)`` for each LR scheduler of an optimizer in ``objs`` and each enabled
    GradScaler (when an optimizer is given) found in ``variables`` but not given."""
    import torch

    passed = _passed(objs)
    optimizers = {id(o) for o in objs if isinstance(o, torch.optim.Optimizer)}
    optimizers |= {i for o in objs if isinstance(o, (list, tuple)) for x in o
                   if isinstance(x, torch.optim.Optimizer) for i in [id(x)]}
    if not optimizers:
        return []
    scalers = tuple(c for c in (getattr(torch.amp, "GradScaler", None),
                                getattr(getattr(torch.cuda, "amp", None), "GradScaler", None)) if c is not None)
    lr = torch.optim.lr_scheduler
    schedulers = getattr(lr, "LRScheduler", None) or getattr(lr, "_LRScheduler")  # the name before torch 2.0
    found: dict[int, tuple[str, str, str]] = {}
    for var, value in variables.items():
        if var.startswith("__") or id(value) in passed or id(value) in found or isinstance(value, _PLAIN):
            continue
        if isinstance(value, schedulers):
            if id(getattr(value, "optimizer", None)) in optimizers:
                found[id(value)] = (var, describe(value), "the LR scheduler of the optimizer it was given")
        elif scalers and isinstance(value, scalers):
            enabled = getattr(value, "is_enabled", lambda: True)()
            if enabled:
                found[id(value)] = (var, describe(value), "a GradScaler beside the optimizer it was given")
    return sorted(found.values())


def warn_forgotten(name: str, objs: tuple) -> None:
    """Warn about the schedulers and scalers that ``end(*objs)`` of block ``name`` left out (call it
    once a block: it reads the calling frame's variables). Never raises: it only advises."""
    from ..errors import warn

    try:
        for var, kind, why in forgotten(objs, frame_variables(caller_frame())):
            warn(f"SkipBlock.end({name!r}) was not given `{var}` ({_a(kind)}, {why}): its state is not "
                 f"checkpointed, so a replay that restores {name!r} starts it fresh and its values diverge; "
                 f"pass it to SkipBlock.end(..., {var})")
    except Exception:  # noqa: BLE001 - advice that cannot be given (even under -W error) must not stop training
        return
