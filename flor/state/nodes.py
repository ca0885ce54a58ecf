"""What the state modules share: the plain values a tree holds as themselves, the torch
dtypes a tree may name, how a class is named, and what a decode reads blobs with.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
import torch.utils.data

from ..store.manifest import TORCH_DTYPES
from .pending import is_plain_tensor

__all__ = ["DTYPES", "Loader", "PRIMITIVES", "PRIMITIVE_SET", "dataclass_attrs", "module_parts", "node_attrs",
           "set_eval", "set_frozen"]


PRIMITIVES = (type(None), bool, int, float, str)
PRIMITIVE_SET = frozenset(PRIMITIVES)
DTYPES: dict[str, torch.dtype] = {n: getattr(torch, n) for n in TORCH_DTYPES if hasattr(torch, n)}

#: reads a blob's verified bytes by hash (a replay: a dict of the checkpoint's blobs, ``.__getitem__``)
Loader = Callable[[str], bytes]


def dataclass_attrs(obj: Any) -> dict:
    """A dataclass instance's fields (those set), then what else its ``__dict__`` holds: the
    "dataclass" node's attributes, for the encoder and the fast walk alike."""
    attrs = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if hasattr(obj, f.name)}
    attrs.update((k, v) for k, v in getattr(obj, "__dict__", {}).items() if k not in attrs)
    return attrs


#: attributes of a DataLoader that are not its state: the iterator of the epoch under way (with
#: persistent workers it is kept between epochs, holding worker processes and a generator
#: object), which ``iter(loader)`` resets from the sampler at each epoch
_LOADER_TRANSIENT = frozenset({"_iterator"})


def node_attrs(obj: Any) -> dict:
    """An "object" node's attributes, for the encoder and the fast walk alike: its ``__dict__``,
    but a DataLoader's live iterator, which cannot be stored and which restoring must not
    replace."""
    attrs = dict(vars(obj))
    if isinstance(obj, torch.utils.data.DataLoader):
        for k in _LOADER_TRANSIENT:
            attrs.pop(k, None)
    return attrs


def module_parts(module: torch.nn.Module) -> tuple[list[str], list[str], dict[str, torch.Tensor]]:
    """What a module's "stateful" node keeps besides its ``state_dict``, in one walk of its
    submodules (a checkpoint's fixed cost: about 2 µs a submodule):

    - "frozen": the ``state_dict`` names of its parameters that do not require grad, in its
      order. ``state_dict`` gives detached tensors, so a backbone unfrozen (``requires_grad_``)
      inside a block would not come back with the weights, and a replay that trains after
      restoring that block would train it frozen;
    - "eval": the names of its submodules in eval mode ("" for itself). A block that ends in
      ``model.eval()`` (validation inside it) leaves the model so for the code after ``end()``;
      a replay that restored the block without it left the mode the model had before, with
      dropout drawing where a full run evaluates;
    - "aux": the tensors its ``state_dict`` leaves out, by dotted name: non-persistent buffers,
      and tensors kept as plain attributes, such as the ``weight`` that the legacy
      ``torch.nn.utils.weight_norm`` and ``spectral_norm`` compute before each forward, so that
      a restore puts them back too. Dense ones only (anything else would be pickled); a
      submodule met twice once.

    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout())
    >>> net[0].register_buffer("seen", torch.zeros(()), persistent=False)
    >>> net[0].scale = torch.ones(2)
    >>> _ = net[1].eval(), net[0].bias.requires_grad_(False)
    >>> frozen, evaluating, aux = module_parts(net)
    >>> frozen, evaluating, list(aux)
    (['0.bias'], ['1'], ['0.seen', '0.scale'])
    >>> module_parts(net.eval())[1]
    ['', '0', '1']
    """
    frozen: list[str] = []
    evaluating: list[str] = []
    aux: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    tensor = torch.Tensor
    for prefix, m in module.named_modules(remove_duplicate=False):
        dot = f"{prefix}." if prefix else ""
        if not m.training:
            evaluating.append(prefix)
        for name, p in m._parameters.items():
            if p is not None and not p.requires_grad:
                frozen.append(dot + name)
        if id(m) in seen:
            continue
        seen.add(id(m))
        for name in m._non_persistent_buffers_set:
            b = m._buffers.get(name)
            if b is not None and is_plain_tensor(b):
                aux[dot + name] = b
        for name, v in m.__dict__.items():
            if type(v) is tensor and not name.startswith("__") and is_plain_tensor(v):
                aux[dot + name] = v
    return frozen, evaluating, aux


def set_eval(module: torch.nn.Module, names: list[str]) -> None:
    """Put an "eval" list back: each submodule it names is in eval mode, every other in training
    mode, set module by module as recorded (not through ``train()``, which a module may override)."""
    evaluating = set(names)
    for prefix, m in module.named_modules(remove_duplicate=False):
        m.training = prefix not in evaluating


def set_frozen(module: torch.nn.Module, frozen: list[str]) -> None:
    """Put a "frozen" list back: every parameter it names stops requiring grad, every other
    floating-point or complex one requires it (integer parameters cannot)."""
    names = set(frozen)
    for prefix, m in module.named_modules(remove_duplicate=False):
        for name, p in m._parameters.items():
            if p is None:
                continue
            wanted = (f"{prefix}.{name}" if prefix else name) not in names
            if p.requires_grad != wanted and (not wanted or p.is_floating_point() or p.is_complex()):
                p.requires_grad_(wanted)
