"""Encoding objects into a state tree: ``snapshot`` walks them (``_Encoder``), copies every
tensor so training may go on, and hands back a ``Pending`` for the writer.
"""

from __future__ import annotations

import dataclasses
import random
from collections import OrderedDict, defaultdict, deque
from typing import Any

import numpy as np
import torch

from ..errors import StateError, warn
from ..leaves import encode_leaf, qualname, sort_key
from ..store.manifest import DEFAULT_FACTORIES, NP_BITGENS, NP_KINDS, dense_stride
from .cache import TreeCache, array_bytes
from .nodes import PRIMITIVE_SET, PRIMITIVES, dataclass_attrs, module_parts, node_attrs
from .pending import BufferPool, Pending, is_plain_tensor, side_stream
from .rng import NumpyRaw, settled

__all__ = ["snapshot", "snapshot_rng"]


_PICKLED_TYPES: set[str] = set()  # warned about once each
_TENSOR, _PARAMETER = torch.Tensor, torch.nn.Parameter
_DTYPE_NAMES: dict[torch.dtype, str] = {}  # "float32" for torch.float32


class _Encoder:
    def __init__(self, copy: bool, pool: BufferPool | None = None, tree_only: bool = False) -> None:
        self.copy = copy  # False when hashing in place (verification), True for a snapshot
        self.pool = pool
        self.tree_only = tree_only  # the tree, with the tensors as read (not copied, nor made contiguous)
        self.pending = Pending(tree=None, pool=pool)
        self._active: set[int] = set()
        self._stream: Any = None

    def _copy_cuda(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Device-to-host copy on a side stream; the training stream waits for it on the GPU
        (not the host) before it may change ``src`` again."""
        if self._stream is None:
            self._stream = side_stream(src.device)
            self._stream.wait_stream(torch.cuda.current_stream(src.device))
        with torch.cuda.stream(self._stream):
            dst.copy_(src, non_blocking=True)
        src.record_stream(self._stream)

    def finish(self) -> Pending:
        if self._stream is not None:
            event = torch.cuda.Event()
            event.record(self._stream)
            torch.cuda.current_stream(self._stream.device).wait_stream(self._stream)
            self.pending.ready = event
        return self.pending

    def tensor(self, t: torch.Tensor, path: str) -> dict:
        if not is_plain_tensor(t):
            return self.pickled(t, path)
        dtype = t.dtype
        name = _DTYPE_NAMES.get(dtype)
        if name is None:
            name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
        node = {"t": "tensor", "dtype": name, "shape": list(t.shape), "device": "cpu" if t.is_cpu else str(t.device),
                "rg": bool(t.requires_grad)}
        data = t if self.tree_only else t.detach()  # tree only: as read, the fast walk's tensor
        if data.is_conj():
            data = data.resolve_conj()
        if data.is_neg():
            data = data.resolve_neg()
        if not data.is_contiguous():  # channels_last, a transposed matrix: stored row-major, restored so
            stride = list(data.stride())
            if dense_stride(node["shape"], stride):
                node["stride"] = stride
        if self.tree_only:
            self.pending.tensors.append((node, data))
            return node
        cuda = data.device.type == "cuda"
        if self.copy and self.pool is not None and (cuda or data.device.type == "cpu"):
            nbytes = data.numel() * data.element_size()
            buf = self.pool.take(nbytes, pinned=cuda)
            self.pending.buffers.append(buf)
            dst = buf.view(data.dtype).view(data.shape) if nbytes else torch.empty(data.shape, dtype=data.dtype)
            if cuda:
                self._copy_cuda(data, dst)
            else:
                dst.copy_(data)
            data = dst
        elif data.device.type != "cpu":
            data = data.to("cpu", memory_format=torch.contiguous_format)
        elif self.copy or not data.is_contiguous():
            data = data.clone(memory_format=torch.contiguous_format)
        self.pending.tensors.append((node, data))
        return node

    def pickled(self, obj: Any, path: str) -> dict:
        import cloudpickle

        try:
            data = cloudpickle.dumps(obj)
        except Exception as exc:  # any pickling failure means: this object cannot be captured
            raise StateError(
                f"cannot capture {path} of type {qualname(obj)}: it is not a tensor, container, "
                f"stateful object or picklable value ({exc}); pass its state_dict-bearing owner "
                "to SkipBlock.end instead"
            ) from exc
        cls = qualname(obj)
        if self.copy and cls not in _PICKLED_TYPES:  # recording: say it once per type
            _PICKLED_TYPES.add(cls)
            warn("FL111", f"{path or 'a value'} is a {cls}, which flor can store only with pickle; a replay loads it "
                 "only from a checkpoint signed with your own key (made in flor's config folder, see "
                 "FLOR_CONFIG_DIR) or with --flor_trust_pickles. Pass end() plain values or objects with "
                 "state_dict() to avoid pickle")
        node = {"t": "pickle", "cls": cls}
        self.pending.raw.append((node, data))
        return node

    def raw(self, kind: str, data: bytes) -> dict:
        node = {"t": kind}
        self.pending.raw.append((node, data))
        return node

    def encode(self, obj: Any, path: str) -> Any:
        t = type(obj)
        if t in PRIMITIVE_SET:
            return obj
        if t is _TENSOR or t is _PARAMETER:  # (no leaf, nor a container: the common case first)
            return self.tensor(obj, path)
        leaf = encode_leaf(obj)  # before the primitives: an IntEnum is an int, but keeps its type
        if leaf is not None:
            return leaf
        if isinstance(obj, PRIMITIVES):  # a subclass (np.float64, np.str_): as its base type, the type a
            return _as_base(obj)          # recorded tree reads back as (replay compares types exactly)
        if type(obj) in (bytes, bytearray):
            return self.raw(type(obj).__name__, bytes(obj))
        if isinstance(obj, torch.dtype):
            return {"t": "torchdtype", "v": str(obj).removeprefix("torch.")}
        if isinstance(obj, torch.device):
            return {"t": "torchdevice", "v": str(obj)}
        if isinstance(obj, np.dtype) and obj.kind in NP_KINDS and obj.fields is None and not obj.hasobject:
            return {"t": "npdtype", "v": obj.str}
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj, path)
        if isinstance(obj, np.ndarray):
            if obj.dtype.hasobject or obj.dtype.kind not in NP_KINDS or obj.dtype.fields is not None \
                    or obj.dtype.subdtype is not None:
                return self.pickled(obj, path)  # objects, a structured or void array: what a reader refuses
            node = {"t": "ndarray", "dtype": obj.dtype.str, "shape": list(obj.shape)}
            if self.tree_only:  # its bytes as the fast walk reads them (None where it does not)
                # a tree_only Pending is only compared (cache._agrees), never stored: a None tensor is allowed
                self.pending.tensors.append((node, array_bytes(obj)))  # type: ignore[arg-type]
                return node
            data = np.ascontiguousarray(obj).copy()
            if not obj.size:
                self.pending.tensors.append((node, torch.empty(0, dtype=torch.uint8)))
                return node
            try:
                self.pending.tensors.append((node, torch.from_numpy(data).view(torch.uint8)))
            except (TypeError, ValueError):  # strings, dates, another byte order, long doubles: no torch
                self.pending.raw.append((node, data.tobytes()))  # tensor of them; their bytes as they are
            return node
        if isinstance(obj, np.generic) and obj.dtype.kind in NP_KINDS:
            if obj.dtype.kind in "mM":  # dates and durations of any unit: their int64 count
                return {"t": "npscalar", "dtype": obj.dtype.str, "v": int(obj.view(np.int64))}
            return {"t": "npscalar", "dtype": obj.dtype.str, "v": self.encode(obj.item(), path)}
        if id(obj) in self._active:
            raise StateError(
                f"cannot capture {path}: it contains itself (a reference cycle); pass the objects "
                "inside it to SkipBlock.end separately"
            )
        self._active.add(id(obj))
        try:
            return self._encode_container(obj, path)
        finally:
            self._active.discard(id(obj))

    def _pairs(self, obj: dict, path: str) -> dict:
        """A mapping node's ``"k"`` and ``"v"``."""
        plain = PRIMITIVE_SET  # (a primitive stands for itself: no call, no path)
        return {"k": [k if type(k) in plain else self.encode(k, f"{path}.<key>") for k in obj],
                "v": [v if type(v) in plain else self.encode(v, f"{path}.{k}") for k, v in obj.items()]}

    def _encode_container(self, obj: Any, path: str) -> Any:
        if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
            if all(type(x) in PRIMITIVES for x in obj):  # fast path: e.g. Python's RNG state
                return {"t": type(obj).__name__, "v": list(obj)}
            return {"t": type(obj).__name__, "v": [self.encode(x, f"{path}[{i}]") for i, x in enumerate(obj)]}
        if isinstance(obj, dict) and type(obj) in (dict, OrderedDict):
            node = {"t": "odict" if type(obj) is OrderedDict else "dict", **self._pairs(obj, path)}
            meta = getattr(obj, "_metadata", None)
            if meta is not None:  # Module.state_dict() versions, used by load_state_dict
                node["meta"] = self.encode(dict(meta), f"{path}._metadata")
            return node
        if isinstance(obj, torch.Generator):
            return {"t": "generator", "device": str(obj.device), "v": self.tensor(obj.get_state(), path)}
        if isinstance(obj, random.Random):
            return {"t": "pyrandom", "v": self.encode(obj.getstate(), path)}
        if isinstance(obj, np.random.RandomState):
            return {"t": "nprandomstate", "v": self.encode(obj.get_state(legacy=False), path)}
        if isinstance(obj, np.random.Generator):
            return {"t": "npgenerator", "v": self.encode(obj.bit_generator.state, path)}
        if isinstance(obj, np.random.BitGenerator) and type(obj).__name__ in NP_BITGENS:
            return {"t": "npbitgen", "cls": type(obj).__name__, "v": self.encode(obj.state, path)}
        if type(obj) is deque:
            items = [self.encode(x, f"{path}[{i}]") for i, x in enumerate(obj)]
            return {"t": "deque", "maxlen": obj.maxlen, "v": items}
        if type(obj) is defaultdict and (factory := _factory_name(obj.default_factory)) in DEFAULT_FACTORIES:
            return {"t": "defaultdict", "factory": factory, **self._pairs(obj, path)}
        if type(obj) in (set, frozenset):
            items = sorted(obj, key=sort_key)
            return {"t": type(obj).__name__, "v": [self.encode(x, f"{path}{{}}") for x in items]}
        if isinstance(obj, tuple) and isinstance(fields := getattr(type(obj), "_fields", None), tuple):
            return {"t": "namedtuple", "cls": qualname(obj), "k": list(fields),
                    "v": [self.encode(x, f"{path}.{k}") for k, x in zip(fields, obj)]}
        if callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None)):
            if isinstance(obj, torch.nn.Module):
                frozen, evaluating, aux = module_parts(obj)
                node = {"t": "stateful", "cls": qualname(obj), "frozen": frozen, "eval": evaluating}
                if aux:  # before "v": the fast walk's order (``flor.state.cache``)
                    node["aux"] = self.encode(aux, f"{path}.<aux>")
                node["v"] = self.encode(obj.state_dict(), path)
                return node
            return {"t": "stateful", "cls": qualname(obj), "v": self.encode(obj.state_dict(), path)}
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return {"t": "dataclass", "cls": qualname(obj), "v": self.encode(dataclass_attrs(obj), path)}
        if isinstance(obj, (list, tuple, dict, set, frozenset, deque)):  # a Counter, a defaultdict of a lambda, a
            # deque subclass: their vars() miss the data
            return self.pickled(obj, path)
        if hasattr(obj, "__dict__") and not isinstance(obj, type) and not callable(obj):
            return {"t": "object", "cls": qualname(obj), "v": self.encode(node_attrs(obj), path)}
        return self.pickled(obj, path)


def _factory_name(factory: Any) -> str | None:
    """A defaultdict's factory's name in DEFAULT_FACTORIES (None: no factory); "" where it is
    none of them (the dict is then pickled)."""
    return next((name for name, f in DEFAULT_FACTORIES.items() if f is factory), "")


def _as_base(obj: Any) -> Any:
    """An int, float or str subclass's value as the base type, the subclass's own conversion
    methods bypassed (bool has no subclasses).

    >>> import numpy as np
    >>> [type(_as_base(x)).__name__ for x in (np.float64(0.5), np.str_("a"))]
    ['float', 'str']
    """
    if isinstance(obj, float):
        return float.__float__(obj)
    if isinstance(obj, int):
        return int.__int__(obj)
    if isinstance(obj, str):
        return str.__str__(obj)
    return obj


def snapshot(objs: Any, *, copy: bool = True, path: str = "", pool: BufferPool | None = None,
             cache: TreeCache | None = None) -> Pending:
    """Encode ``objs``; with ``copy`` every tensor is copied so training may go on at once
    (into ``pool``'s reusable buffers when given). With ``cache`` (one per block), a snapshot
    of objects that kept their structure since the last one takes the fast path, and one
    that learns the structure (the first, or the first since it changed) is the fast walk's
    copies under this encoding's tree (``TreeCache.first``)."""
    if cache is not None and copy:
        fast = cache.snapshot(objs)
        if fast is None:
            fast = cache.first(objs, lambda objs: _tree_only(objs, path))
        if fast is not None:
            return fast
    enc = _Encoder(copy=copy, pool=pool)
    enc.pending.tree = enc.encode(objs, path)
    return enc.finish()


def _tree_only(objs: Any, path: str) -> Pending:
    """The encoding of ``objs`` without copies: its tree, and its tensors as read (``TreeCache.first``)."""
    enc = _Encoder(copy=False, tree_only=True)
    enc.pending.tree = enc.encode(objs, path)
    return enc.pending


_RNG_KEYS = ("python", "numpy", "torch")
_NUMPY_KEYS = ("bit_generator", "state", "has_gauss", "gauss")


def snapshot_rng(state: Any) -> Pending:
    """``snapshot(state, copy=False)`` of a ``capture_rng()`` state, without the general walk.

    The usual capture (Python's words as bytes, NumPy's MT19937, torch's CPU generator, no
    CUDA) has one shape, so its tree is written out here: the writer encodes one or two of
    these per checkpoint, and the general encoder cost it ~0.1 ms each after an epoch of training
    (issue #13). Anything else (CUDA generators, another bit generator) takes ``snapshot``.
    The tree and the leaves, in their order, are the same.

    >>> from flor.state.rng import capture_rng
    >>> state = capture_rng()
    >>> fast, slow = snapshot_rng(state), snapshot(state, copy=False)
    >>> fast.tree == slow.tree and [bytes(d) for _, d in fast.leaves()] == [bytes(d) for _, d in slow.leaves()]
    True
    >>> raw = snapshot_rng(capture_rng(raw=True))  # read from memory: the same again
    >>> raw.tree == slow.tree and [bytes(d) for _, d in raw.leaves()] == [bytes(d) for _, d in slow.leaves()]
    True
    """
    state = settled(state)  # torch's generator as a clone: its state tensor
    if type(state) is dict and isinstance(state.get("numpy"), NumpyRaw):  # capture_rng(raw=True)
        return _snapshot_raw_rng(state)
    try:
        if type(state) is not dict or tuple(state) != _RNG_KEYS:
            raise LookupError
        py, npy, tch = state["python"], state["numpy"], state["torch"]
        version, words, gauss = py
        numpy_state = npy["state"]
        key = numpy_state["key"]
        if not (_plain_rng(py, tch) and type(npy) is dict and tuple(npy) == _NUMPY_KEYS
                and npy["bit_generator"] == "MT19937"
                and type(npy["has_gauss"]) is int and type(npy["gauss"]) is float
                and type(numpy_state) is dict and tuple(numpy_state) == ("key", "pos")
                and type(numpy_state["pos"]) is int and type(key) is np.ndarray and key.ndim == 1 and key.size
                and key.dtype.kind in NP_KINDS and not key.dtype.hasobject):
            raise LookupError
    except (LookupError, TypeError, ValueError):
        return snapshot(state, copy=False)
    return _rng_pending(py, key.dtype.str, key.size, numpy_state["pos"], npy["has_gauss"], npy["gauss"],
                        np.ascontiguousarray(key).tobytes(), tch)


def _plain_rng(py: Any, tch: Any) -> bool:
    """Whether a capture's Python and torch states have the usual form (words as bytes, a CPU byte tensor)."""
    version, words, gauss = py
    return (type(py) is tuple and type(version) is int and type(words) is bytes and type(gauss) in (type(None), float)
            and type(tch) is torch.Tensor and tch.dtype is torch.uint8 and tch.ndim == 1 and tch.is_cpu
            and tch.is_contiguous() and not tch.requires_grad)


_KEY_DTYPE = np.dtype(np.uint32).str


def _snapshot_raw_rng(state: dict) -> Pending:
    """``snapshot_rng`` of a capture whose NumPy state was read raw (``NumpyRaw``): the same
    tree and leaves as from the ``get_state`` form."""
    npy = state["numpy"]
    try:
        if tuple(state) != _RNG_KEYS or not _plain_rng(state["python"], state["torch"]):
            raise LookupError
    except (LookupError, TypeError, ValueError):
        return snapshot({**state, "numpy": npy.as_dict()}, copy=False)
    return _rng_pending(state["python"], _KEY_DTYPE, len(npy.key) // 4, npy.pos, npy.has_gauss, npy.gauss,
                        npy.key, state["torch"])


def _rng_pending(py: tuple, key_dtype: str, key_size: int, pos: int, has_gauss: int, gauss: float,
                 key_bytes: bytes, tch: torch.Tensor) -> Pending:
    """The RNG tree; every leaf as bytes (no tensor views to make on the writer)."""
    version, words, py_gauss = py
    key_node = {"t": "ndarray", "dtype": key_dtype, "shape": [key_size]}
    torch_node = {"t": "tensor", "dtype": "uint8", "shape": [tch.numel()], "device": "cpu", "rg": False}
    words_node = {"t": "bytes"}
    tree = {"t": "dict", "k": list(_RNG_KEYS), "v": [
        {"t": "tuple", "v": [version, words_node, py_gauss]},
        {"t": "dict", "k": list(_NUMPY_KEYS), "v": [
            "MT19937", {"t": "dict", "k": ["key", "pos"], "v": [key_node, pos]}, has_gauss, gauss]},
        torch_node]}
    return Pending(tree=tree, raw=[(key_node, key_bytes), (torch_node, tch.numpy().tobytes()), (words_node, words)])
