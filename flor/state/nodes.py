"""What the state modules share: the plain values a tree holds as themselves, the torch
dtypes a tree may name, how a class is named, and what a decode reads blobs with.
"""

from __future__ import annotations

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
