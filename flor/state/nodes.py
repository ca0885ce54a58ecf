"""What the state modules share: the plain values a tree holds as themselves, the torch
dtypes a tree may name, how a class is named, and what a decode reads blobs with.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from ..store.manifest import TORCH_DTYPES

__all__ = ["Loader"]


_PRIMITIVES = (type(None), bool, int, float, str)
_PRIMITIVE_SET = frozenset(_PRIMITIVES)
_TORCH_DTYPES: dict[str, torch.dtype] = {n: getattr(torch, n) for n in TORCH_DTYPES if hasattr(torch, n)}

#: reads a blob's verified bytes by hash (a replay: a dict of the checkpoint's blobs, ``.__getitem__``)
Loader = Callable[[str], bytes]


def _qualname(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _dataclass_attrs(obj: Any) -> dict:
    """A dataclass instance's fields (those set), then what else its ``__dict__`` holds: the
    "dataclass" node's attributes, for the encoder and the fast walk alike."""
    attrs = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if hasattr(obj, f.name)}
    attrs.update((k, v) for k, v in getattr(obj, "__dict__", {}).items() if k not in attrs)
    return attrs
