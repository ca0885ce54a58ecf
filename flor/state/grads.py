"""The gradients a block leaves in ``p.grad``, for the blocks whose next run adds to them.

A module's ``state_dict`` holds no gradients, and for most training loops that is right:
``zero_grad`` runs before the first backward. A block whose next run *accumulates* into the
gradient its previous run left (an accumulation window that spans the end of an epoch, or no
``zero_grad`` before the first backward) starts from state its checkpoint does not hold: a
replay that restores it and re-executes the next run must put those gradients back. The
recorder notices such a block at its second run (``flor.watch.grads.CarriedGrad``) and
from then on its checkpoints carry a ``"grads"`` tree, ``module_grads``'s dict::

    {"0": {"weight": tensor, ...}, "2.1": {...}}   end() argument 0, argument 2's item 1

A parameter whose gradient is None is absent, and a restore sets it back to None (an
optimizer skips such a parameter, where a zero gradient would still move Adam's moments).
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from ..errors import CheckpointError, StateError
from .decode import decode
from .nodes import Loader
from .pending import is_plain_tensor

__all__ = ["module_grads", "modules_among", "restore_grads"]


def modules_among(objs: Any) -> Iterator[tuple[str, torch.nn.Module]]:
    """The modules given to ``end()`` with where they are: ``"i"`` for argument ``i``,
    ``"i.j"`` for item ``j`` of a list or tuple argument ``i`` (one level, as the objects of a
    GAN are often passed)."""
    for i, o in enumerate(objs):
        if isinstance(o, torch.nn.Module):
            yield str(i), o
        elif isinstance(o, (list, tuple)):
            for j, m in enumerate(o):
                if isinstance(m, torch.nn.Module):
                    yield f"{i}.{j}", m


def module_grads(objs: Any) -> dict[str, dict[str, torch.Tensor]]:
    """``{where: {parameter name: p.grad}}`` of the modules among ``objs``, the parameters
    whose gradient is not None (``named_parameters``: a shared parameter once)."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for where, module in modules_among(objs):
        grads = {name: p.grad for name, p in module.named_parameters() if p.grad is not None}
        for name, g in grads.items():
            if not is_plain_tensor(g):  # it would be pickled, and a replay loads no pickle unasked
                raise StateError(f"the gradient of {name} is a {g.layout} tensor, which flor does not store")
        out[where] = grads
    return out


def restore_grads(objs: Any, node: Any, load: Loader, where: str = "grads") -> None:
    """Set ``p.grad`` of the modules among ``objs`` from a ``"grads"`` tree: the recorded
    gradient (copied to the parameter's device), or None where none was recorded. Checked
    before anything is set: a tree naming a module or parameter ``objs`` do not have, or a
    gradient of another shape or dtype, is a CheckpointError naming it."""
    recorded = decode(node, load, path=where)
    modules = dict(modules_among(objs))
    if not isinstance(recorded, dict) or not all(isinstance(k, str) and isinstance(v, dict)
                                                 for k, v in recorded.items()):
        raise CheckpointError(f"{where}: not a dict of modules' gradients; the checkpoint is damaged")
    plan: list[tuple[torch.nn.Parameter, torch.Tensor | None]] = []
    for key, grads in recorded.items():
        module = modules.get(key)
        if module is None:
            raise CheckpointError(f"{where}: gradients recorded for end() argument {key}, which is not a module now; "
                                  "the checkpoint is damaged, or the script passes other objects to end()")
        params = dict(module.named_parameters())
        for name, g in grads.items():
            p = params.get(name) if isinstance(name, str) else None
            if p is None or not isinstance(g, torch.Tensor):
                raise CheckpointError(f"{where}[{key}]: a gradient for {name!r:.80}, which module "
                                      f"{type(module).__name__} has no parameter named; the checkpoint is damaged")
            if g.shape != p.shape or g.dtype != p.dtype:
                raise CheckpointError(f"{where}[{key}].{name}: a {g.dtype} gradient of shape {tuple(g.shape)} for a "
                                      f"{p.dtype} parameter of shape {tuple(p.shape)}; the checkpoint is damaged")
        plan.extend((p, grads.get(name)) for name, p in params.items())
    for p, g in plan:
        p.grad = None if g is None else g.detach().to(p.device)
