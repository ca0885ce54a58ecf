"""Capture and restore the state of the objects given to ``SkipBlock.end`` and of the RNGs.

State is encoded as a JSON tree whose tensor leaves point at raw-byte blobs by hash, so
modules, optimizers, schedulers, grad scalers and RNG states never go through pickle, nor do
the common plain leaves (``flor.leaves``: complex, pathlib paths, dates and times, decimals,
UUIDs, enums; here: bytes, sets, namedtuples, dataclasses, torch and numpy dtypes, devices,
numpy generators). Only what remains falls back to cloudpickle (``{"t": "pickle"}``), with a
warning once per type; a replay loads such a leaf only when ``PickleTrust`` allows it (a
manifest signed with the user's key, or ``--flor_trust_pickles``), since loading a pickle
can run code. Everything read back is checked: a damaged tree is a ``StateError`` or
``CheckpointError``, never an internal exception.

Node forms (plain JSON values stand for themselves: None, bool, int, float, str)::

    {"t": "list"|"tuple", "v": [node...]}
    {"t": "dict"|"odict", "k": [node...], "v": [node...], "meta": node?}
    {"t": "tensor", "h": hash, "dtype": str, "shape": [int], "device": str, "rg": bool}
    {"t": "ndarray", "h": hash, "dtype": str, "shape": [int]}
    {"t": "npscalar", "dtype": str, "v": value}
    {"t": "stateful", "cls": str, "v": node}       state_dict()/load_state_dict()
    {"t": "generator", "device": str, "v": node}   torch.Generator
    {"t": "pyrandom"|"nprandomstate"|"npgenerator", "v": node}
    {"t": "npbitgen", "cls": "PCG64"|..., "v": node}
    {"t": "object", "cls": str, "v": node}         restored attribute by attribute, in place
    {"t": "dataclass", "cls": str, "v": node}      in place, or a new one when frozen
    {"t": "namedtuple", "cls": str, "k": [str], "v": [node...]}
    {"t": "set"|"frozenset", "v": [node...]}       members in a fixed order
    {"t": "bytes"|"bytearray", "h": hash}
    {"t": "torchdtype"|"torchdevice"|"npdtype", "v": str}
    {"t": "pickle", "h": hash, "cls": str, "sha256": hex}
    flor.leaves' plain leaves: complex, path, datetime, date, time, timedelta, decimal, uuid, enum

A leaf of under ``PACK_LEAF_BYTES`` recorded by a checkpoint lives in a pack, one blob per
checkpoint holding the small leaves end to end: its node adds ``"o"`` and ``"n"`` (offset and
size in the pack named by ``"h"``) and ``"x"`` (the leaf's own hash).

Capture is split in two so the training thread pays only for copies: ``snapshot`` builds the
tree and copies every tensor (``Pending``); ``Pending.materialize`` hashes and stores them,
normally on the background writer.
"""

from __future__ import annotations

import array
import dataclasses
import hashlib
import itertools
import json
import random
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from .errors import CheckpointError, FlorError, StateError, warn
from .leaves import LEAF_KINDS, decode_leaf, encode_leaf, find_class, sort_key
from .logs import same_value
from .store.hashing import hash_bytes
from .store.local import DIRECT_MIN, PAGE
from .store.manifest import NP_BITGENS, NP_KINDS, TORCH_DTYPES

__all__ = [
    "BufferPool",
    "PACK_LEAF_BYTES",
    "PackIndex",
    "Pending",
    "PickleTrust",
    "RNG_BYTES",
    "TreeCache",
    "capture_rng",
    "diff_nodes",
    "hash_and_pack",
    "restore",
    "restore_all",
    "restore_rng",
    "snapshot",
]

_PRIMITIVES = (type(None), bool, int, float, str)
_PICKLED_TYPES: set[str] = set()  # warned about once each


def _qualname(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass(frozen=True)
class PickleTrust:
    """Whether a replay may load pickled leaves (a pickle can run code), and if not, why not.

    ``allowed``: the manifest is signed with the user's key, or the user passed
    ``--flor_trust_pickles``. ``why`` and ``key_file`` make the refusal say how to allow it.
    """

    allowed: bool = False
    why: str = "nothing allowed it"
    key_file: str = "~/.config/flor/key"

    def check(self, path: str, cls: str) -> None:
        if self.allowed:
            return
        raise StateError(
            f"{path or 'a leaf'} is a pickled {cls} in this checkpoint, and flor loads pickles from a store only "
            f"when told to (loading one can run any code); not loaded because {self.why}. If you trust whoever "
            "can write to this store, replay with --flor_trust_pickles (or FLOR_TRUST_PICKLES=1); or put the "
            f"recording machine's key in {self.key_file}, so its signature verifies here"
        )


REFUSE_PICKLES = PickleTrust()


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous CPU tensor, without a copy."""
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def _aligned_empty(nbytes: int) -> torch.Tensor:
    """An uninitialized ``uint8`` buffer; page-aligned when it is large enough for the store to
    write it around the page cache (``flor.store.local.DIRECT_MIN``)."""
    if nbytes < DIRECT_MIN:
        return torch.empty(nbytes, dtype=torch.uint8)
    raw = torch.empty(nbytes + PAGE, dtype=torch.uint8)
    start = -raw.data_ptr() % PAGE
    return raw[start:start + nbytes]


def _empty_like(shape: Any, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized contiguous CPU tensor, in an ``_aligned_empty`` buffer."""
    shape = [int(d) for d in shape]
    nbytes = torch.Size(shape).numel() * dtype.itemsize
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    return _aligned_empty(nbytes).view(dtype).view(shape)


def _is_plain_tensor(t: torch.Tensor) -> bool:
    return t.layout == torch.strided and not t.is_quantized and not t.is_nested


class BufferPool:
    """Reusable host buffers for snapshots, keyed by size.

    Copying into memory that was already touched runs at memcpy speed; a fresh allocation
    pays page faults on every epoch (measured here: 9-12 GB/s vs 0.85-2.7 GB/s). Buffers
    for CUDA tensors are pinned, so device-to-host copies can run asynchronously.
    """

    def __init__(self) -> None:
        self._free: dict[tuple[int, bool], list[torch.Tensor]] = {}
        self._lock = threading.Lock()

    def take(self, nbytes: int, *, pinned: bool = False) -> torch.Tensor:
        with self._lock:
            free = self._free.get((nbytes, pinned))
            if free:
                return free.pop()
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) if pinned else _aligned_empty(nbytes)

    def give(self, buffers: list[torch.Tensor]) -> None:
        with self._lock:
            for buf in buffers:
                self._free.setdefault((buf.numel(), buf.is_pinned()), []).append(buf)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(k[0] * len(v) for k, v in self._free.items())


@dataclass
class Pending:
    """A captured tree whose leaves still need hashing (and storing)."""

    tree: Any
    tensors: list[tuple[dict, torch.Tensor]] = field(default_factory=list)
    raw: list[tuple[dict, bytes]] = field(default_factory=list)
    buffers: list[torch.Tensor] = field(default_factory=list)
    pool: BufferPool | None = None
    ready: Any = None  # a CUDA event that completes when the asynchronous copies have landed
    build: Callable[[], tuple[Any, list[dict]]] | None = None  # the tree and tensor nodes, made on the writer
    on_release: Callable[[], None] | None = None  # gives a TreeCache's buffer set back
    buffer_set: _BufferSet | None = None  # the TreeCache buffers ``tensors`` are, whose byte views it keeps

    @property
    def nbytes(self) -> int:
        if self.buffer_set is not None and not self.raw:  # the fast path: known from the buffers
            return self.buffer_set.nbytes
        return sum(t.numel() * t.element_size() for _, t in self.tensors) + sum(len(b) for _, b in self.raw)

    def hashed(self) -> list[tuple[memoryview | bytes, str]]:
        """Hash every leaf once and note the hash in the tree; return the ``(bytes, hash)``
        pairs to store, still views of the pooled buffers (no copy): store them, then
        ``release()``. Runs on the background writer. (``hash_and_pack`` with every leaf its
        own blob.)"""
        return hash_and_pack([self], threshold=0, pack_all=-1)[0]

    def built(self) -> Any:
        """The tree, made from a TreeCache's template first where the snapshot took the fast path."""
        if self.build is not None:
            self.tree, nodes = self.build()
            self.tensors = [(node, data) for node, (_, data) in zip(nodes, self.tensors)]
            self.build = None
        return self.tree

    def leaves(self) -> list[tuple[dict, memoryview | bytes]]:
        """``(node, bytes)`` of every leaf to store, views of the pooled buffers (no copy)."""
        if self.ready is not None:
            self.ready.synchronize()
        self.built()
        if self.buffer_set is not None:
            views = self.buffer_set.views()
            return [(node, view) for (node, _), view in zip(self.tensors, views)] + list(self.raw)
        return [(node, _tensor_bytes(tensor)) for node, tensor in self.tensors] + list(self.raw)

    def release(self) -> None:
        """Give the pooled buffers back (after their bytes are stored); the tree stays."""
        self.built()  # the tree stays: make it before the buffers go
        self.tensors, self.raw, self.buffer_set = [], [], None
        if self.pool is not None:
            self.pool.give(self.buffers)
        self.buffers = []
        if self.on_release is not None:
            self.on_release()
            self.on_release = None

    def materialize(self, put: Callable[[memoryview | bytes, str], Any] | None = None) -> Any:
        """Hash every leaf, hand its bytes to ``put(data, hash)`` if given; return the tree.

        The pooled buffers go back to the pool afterwards.
        """
        try:
            for data, digest in self.hashed():
                if put is not None:
                    put(data, digest)
        finally:
            self.release()
        return self.tree


#: leaves smaller than this go, concatenated, into one blob per checkpoint (a pack): on a
#: local disk each file costs ~0.1-0.4 ms of CPU whatever its size (open, write, sync,
#: rename), so a small model's 30-odd biases, optimizer steps and RNG states cost more as
#: files than all of their bytes (issue #13)
PACK_LEAF_BYTES = 64 * 1024
#: a checkpoint whose leaves add up to at most this many bytes is stored as ONE pack: a small
#: model's few 256 KiB weights cost a file each otherwise (mkdir, open, write, sync, rename,
#: folder sync: ~1 ms of writer CPU per checkpoint on this project's VM), and its unchanged
#: leaves are still stored once per run (``PackIndex`` points into earlier packs)
PACK_ALL_BYTES = 4 << 20


class PackIndex:
    """Where this run stored each small leaf: ``leaf hash -> (pack hash, offset, size)``.

    A leaf that an earlier checkpoint of the run stored already is pointed at there, so an
    unchanged small tensor is stored once per run, as a large one is once per store.
    ``remember`` only after the packs are durable. Bounded: forgets everything past
    ``limit`` entries (the leaves are then packed again).
    """

    def __init__(self, limit: int = 1 << 17) -> None:
        self.where: dict[str, tuple[str, int, int]] = {}
        self.limit = limit

    def remember(self, entries: dict[str, tuple[str, int, int]]) -> None:
        if len(self.where) + len(entries) > self.limit:
            self.where.clear()
        self.where.update(entries)


def hash_and_pack(parts: list[Pending], index: PackIndex | None = None, threshold: int = PACK_LEAF_BYTES,
                  pack_all: int = PACK_ALL_BYTES) -> tuple[list[tuple[memoryview | bytes, str]], dict]:
    """Hash every leaf of ``parts`` once and note where its bytes go in its node; return the
    ``(bytes, hash)`` blobs to store and the index entries to ``remember`` once they are.

    A leaf of ``threshold`` bytes or more is its own blob (``"h"``: its hash; deduplicated
    across runs), unless all the leaves together are at most ``pack_all`` bytes. A smaller one
    points into a pack: ``"h"`` the pack's hash, ``"o"``/``"n"`` its offset and size there,
    ``"x"`` its own hash (what comparisons use). Runs on the background writer; the large
    blobs are still views of the pooled buffers (no copy); a pack large enough to be written
    around the page cache is assembled in a page-aligned buffer.
    """
    blobs: list[tuple[memoryview | bytes, str]] = []
    small: list[tuple[dict, memoryview | bytes, str]] = []
    leaves = [(node, data, memoryview(data).nbytes) for part in parts for node, data in part.leaves()]
    if sum(n for _, _, n in leaves) <= pack_all:
        threshold = pack_all + 1
    for node, data, nbytes in leaves:
        digest = hash_bytes(data)
        if node["t"] == "pickle":  # signed with the manifest: a blob hash alone is easy to forge
            node["sha256"] = hashlib.sha256(data).hexdigest()
        if nbytes >= threshold:
            node["h"] = digest
            blobs.append((data, digest))
        else:
            small.append((node, data, digest))
    known = index.where if index is not None else {}
    chunks: list[memoryview | bytes] = []
    offsets: dict[str, tuple[int, int]] = {}
    size = 0
    for _, data, digest in small:
        if digest not in known and digest not in offsets:
            n = memoryview(data).nbytes
            offsets[digest] = (size, n)
            chunks.append(data)
            size += n
    entries: dict[str, tuple[str, int, int]] = {}
    if chunks:
        pack = _joined(chunks, size)
        pack_hash = hash_bytes(pack)
        blobs.append((pack, pack_hash))
        entries = {d: (pack_hash, o, n) for d, (o, n) in offsets.items()}
    for node, _, digest in small:
        where = entries.get(digest) or known[digest]
        node["h"], node["o"], node["n"], node["x"] = where[0], where[1], where[2], digest
    return blobs, entries


def _joined(chunks: list[memoryview | bytes], size: int) -> memoryview | bytes:
    """The chunks one after the other; in a page-aligned buffer where the store writes it
    around the page cache (a buffered write costs the writer 2-4 CPU-s per GB)."""
    if size < DIRECT_MIN:
        return b"".join(chunks)
    out = _tensor_bytes(_aligned_empty(size))
    at = 0
    for chunk in chunks:
        n = memoryview(chunk).nbytes
        out[at:at + n] = memoryview(chunk).cast("B")
        at += n
    return out


class _Encoder:
    def __init__(self, copy: bool, pool: BufferPool | None = None) -> None:
        self.copy = copy  # False when hashing in place (verification), True for a snapshot
        self.pool = pool
        self.pending = Pending(tree=None, pool=pool)
        self._active: set[int] = set()
        self._stream: Any = None

    def _copy_cuda(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Device-to-host copy on a side stream; the training stream waits for it on the GPU
        (not the host) before it may change ``src`` again."""
        if self._stream is None:
            self._stream = _side_stream(src.device)
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
        if not _is_plain_tensor(t):
            return self.pickled(t, path)
        node = {
            "t": "tensor", "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
            "device": str(t.device), "rg": bool(t.requires_grad),
        }
        data = t.detach()
        if data.is_conj():
            data = data.resolve_conj()
        if data.is_neg():
            data = data.resolve_neg()
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
                f"cannot capture {path} of type {_qualname(obj)}: it is not a tensor, container, "
                f"stateful object or picklable value ({exc}); pass its state_dict-bearing owner "
                "to SkipBlock.end instead"
            ) from exc
        cls = _qualname(obj)
        if self.copy and cls not in _PICKLED_TYPES:  # recording: say it once per type
            _PICKLED_TYPES.add(cls)
            warn(f"{path or 'a value'} is a {cls}, which flor can store only with pickle; a replay loads it "
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
        if type(obj) in _PRIMITIVES:
            return obj
        leaf = encode_leaf(obj)  # before the primitives: an IntEnum is an int, but keeps its type
        if leaf is not None:
            return leaf
        if isinstance(obj, _PRIMITIVES):
            return obj
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
            if obj.dtype.hasobject:
                return self.pickled(obj, path)
            node = {"t": "ndarray", "dtype": obj.dtype.str, "shape": list(obj.shape)}
            self.pending.tensors.append((node, torch.from_numpy(np.ascontiguousarray(obj).copy()).view(torch.uint8)
                                         if obj.size else torch.empty(0, dtype=torch.uint8)))
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

    def _encode_container(self, obj: Any, path: str) -> Any:
        if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
            if all(type(x) in _PRIMITIVES for x in obj):  # fast path: e.g. Python's RNG state
                return {"t": type(obj).__name__, "v": list(obj)}
            return {"t": type(obj).__name__, "v": [self.encode(x, f"{path}[{i}]") for i, x in enumerate(obj)]}
        if isinstance(obj, dict) and type(obj) in (dict, OrderedDict):
            node = {
                "t": "odict" if type(obj) is OrderedDict else "dict",
                "k": [self.encode(k, f"{path}.<key>") for k in obj],
                "v": [self.encode(v, f"{path}.{k}") for k, v in obj.items()],
            }
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
        if type(obj) in (set, frozenset):
            items = sorted(obj, key=sort_key)
            return {"t": type(obj).__name__, "v": [self.encode(x, f"{path}{{}}") for x in items]}
        if isinstance(obj, tuple) and isinstance(getattr(type(obj), "_fields", None), tuple):
            return {"t": "namedtuple", "cls": _qualname(obj), "k": list(type(obj)._fields),
                    "v": [self.encode(x, f"{path}.{k}") for k, x in zip(type(obj)._fields, obj)]}
        if callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None)):
            return {"t": "stateful", "cls": _qualname(obj), "v": self.encode(obj.state_dict(), path)}
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            attrs = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if hasattr(obj, f.name)}
            attrs.update((k, v) for k, v in getattr(obj, "__dict__", {}).items() if k not in attrs)
            return {"t": "dataclass", "cls": _qualname(obj), "v": self.encode(attrs, path)}
        if isinstance(obj, (list, tuple, dict, set, frozenset)):  # a Counter, a defaultdict: their vars() miss the data
            return self.pickled(obj, path)
        if hasattr(obj, "__dict__") and not isinstance(obj, type) and not callable(obj):
            return {"t": "object", "cls": _qualname(obj), "v": self.encode(dict(vars(obj)), path)}
        return self.pickled(obj, path)


def snapshot(objs: Any, *, copy: bool = True, path: str = "", pool: BufferPool | None = None,
             cache: TreeCache | None = None) -> Pending:
    """Encode ``objs``; with ``copy`` every tensor is copied so training may go on at once
    (into ``pool``'s reusable buffers when given). With ``cache`` (one per block), a snapshot
    of objects that kept their structure since the last one takes the fast path
    (``TreeCache``)."""
    if cache is not None and copy:
        fast = cache.snapshot(objs)
        if fast is not None:
            return fast
    enc = _Encoder(copy=copy, pool=pool)
    enc.pending.tree = enc.encode(objs, path)
    pending = enc.finish()
    if cache is not None and copy:
        cache.learn(objs, pending)
    return pending


_PRIMITIVE_SET = frozenset(_PRIMITIVES)


def _flatten(obj: Any, sig: list, vals: list, tensors: list, depth: int = 0) -> bool:
    """Walk ``obj`` as ``_Encoder.encode`` would, collecting its structure (``sig``: every
    object's type, every dict's keys, every tensor's dtype, shape and requires_grad), its
    plain values and its tensors; False where the fast path does not apply."""
    t = type(obj)
    if t in _PRIMITIVE_SET:
        sig.append(t)
        vals.append(obj)
        return True
    if depth > 64:
        return False
    if t is torch.Tensor or t is torch.nn.Parameter:
        dtype = obj.dtype
        if not obj.is_cpu or obj.layout is not torch.strided or obj.is_quantized or obj.is_nested \
                or (dtype.is_complex and (obj.is_conj() or obj.is_neg())):
            return False
        sig.append((t, dtype, obj.shape, obj.requires_grad))
        tensors.append(obj)
        return True
    if t is list or t is tuple:
        sig.append((t, len(obj)))
        for x in obj:
            if not _flatten(x, sig, vals, tensors, depth + 1):
                return False
        return True
    if t is dict or t is OrderedDict:
        keys = tuple(obj)
        types = tuple(map(type, keys))
        if not _PRIMITIVE_SET.issuperset(types):
            return False
        meta = getattr(obj, "_metadata", None)
        sig.append((t, keys, types, meta is not None))
        for v in obj.values():
            if not _flatten(v, sig, vals, tensors, depth + 1):
                return False
        return meta is None or (type(meta) in (dict, OrderedDict) and _flatten(dict(meta), sig, vals, tensors, depth + 1))
    if isinstance(obj, (torch.nn.Module, torch.optim.Optimizer)) or (
            type(obj).__module__.startswith("torch.") and callable(getattr(obj, "state_dict", None))
            and callable(getattr(obj, "load_state_dict", None))):
        sig.append(t)
        return _flatten(obj.state_dict(), sig, vals, tensors, depth + 1)
    return False


def _build(node: Any, vals: Any, nodes: list[dict]) -> Any:
    """A new tree shaped like the template ``node``, its plain values taken from ``vals`` in
    walk order and its tensor nodes copied (and listed in ``nodes``, to be hashed)."""
    if not isinstance(node, dict):
        return next(vals)
    kind = node["t"]
    if kind == "tensor":
        out = {k: v for k, v in node.items() if k not in ("h", "o", "n", "x")}
        nodes.append(out)
        return out
    if kind in ("list", "tuple"):
        return {"t": kind, "v": [_build(x, vals, nodes) for x in node["v"]]}
    if kind in ("dict", "odict"):
        out = {"t": kind, "k": node["k"], "v": [_build(x, vals, nodes) for x in node["v"]]}
        if "meta" in node:
            out["meta"] = _build(node["meta"], vals, nodes)
        return out
    if kind == "stateful":
        return {"t": kind, "cls": node["cls"], "v": _build(node["v"], vals, nodes)}
    raise _NotTemplate(kind)


class _NotTemplate(Exception):
    pass


class TreeCache:
    """One block's snapshot structure, reused while its objects keep it (issue #13).

    The first snapshot of a block encodes it in full (``_Encoder``) and keeps the tree as a
    template, with the signature of what it walked (``_flatten``: types, dict keys, tensor
    dtypes and shapes). A later snapshot only walks the objects for their plain values,
    tensors and signature; when the signature is the same, the tensors are copied in one
    call into a set of buffers kept for this block, and the tree is rebuilt from the
    template with the new values on the background writer (``Pending.built``). Objects the
    walk does not know (numpy arrays, plain objects, CUDA tensors, ...) keep the block on
    the full encoding, which is always right.

    Buffer sets are reused once their checkpoint is written; ``top_up`` (on the writer) keeps
    one spare set, touched so its pages exist, while ``memory`` allows: a snapshot taken while
    the writer is one checkpoint behind copies at memory speed instead of page-faulting.
    """

    def __init__(self, memory: int = 1 << 30) -> None:
        self.memory = memory
        self.sig: list | None = None
        self.template: Any = None
        self.off = False  # the objects hold something the fast walk does not know
        self.nbytes = 0
        self.sets = 0  # buffer sets made
        self._free: list[_BufferSet] = []
        self._lock = threading.Lock()

    def learn(self, objs: Any, pending: Pending) -> None:
        """Keep the tree ``pending`` encoded in full as the template, if the fast walk agrees with it."""
        sig: list = []
        vals: list = []
        tensors: list = []
        if self.off or not _flatten(objs, sig, vals, tensors) or len(tensors) != len(pending.tensors) \
                or pending.raw:
            self.off = True
            return
        try:
            nodes: list[dict] = []
            rebuilt = _build(pending.tree, iter(vals), nodes)
        except (_NotTemplate, StopIteration, KeyError, TypeError):
            self.off = True
            return
        text = _json_or_none(rebuilt)
        if text is None or text != _json_or_none(pending.tree):
            self.off = True  # NaN, or a walk that differs from the encoder's: always encode in full
            return
        self.sig, self.template = sig, pending.tree
        self.nbytes = sum(t.numel() * t.element_size() for t in tensors)
        dsts = _BufferSet(d for _, d in pending.tensors)  # this snapshot's copies: the block's first buffer set
        if all(d.device.type == "cpu" and d.is_contiguous() for d in dsts):
            self.sets = 1
            pending.pool, pending.buffers = None, []
            pending.on_release = lambda: self._give(dsts, sig)

    def snapshot(self, objs: Any) -> Pending | None:
        """The fast path (None: take the full one)."""
        if self.off or self.sig is None:
            return None
        sig: list = []
        vals: list = []
        tensors: list = []
        if not _flatten(objs, sig, vals, tensors) or sig != self.sig:
            self.sig = None  # changed structure: the next full encoding makes the template again
            with self._lock:
                self._free.clear()
            return None
        dsts = self._take(tensors)
        if tensors:  # a block may keep no tensor at all (a dict of counters)
            with torch.no_grad():
                torch._foreach_copy_(dsts, tensors)
        template = self.template

        def build() -> tuple[Any, list[dict]]:
            nodes: list[dict] = []
            return _build(template, iter(vals), nodes), nodes

        return Pending(tree=None, tensors=[(None, d) for d in dsts], build=build,  # type: ignore[misc]
                       on_release=lambda: self._give(dsts, sig), buffer_set=dsts)

    def _take(self, like: list[torch.Tensor]) -> _BufferSet:
        with self._lock:
            if self._free:
                return self._free.pop()
            self.sets += 1
        return _BufferSet(_empty_like(t.shape, t.dtype) for t in like)

    def _give(self, dsts: _BufferSet, sig: list) -> None:
        with self._lock:
            if sig is self.sig or sig == self.sig:
                self._free.append(dsts)

    def top_up(self) -> None:
        """Keep one spare buffer set, its pages touched (on the writer, not training); within ``memory``."""
        with self._lock:
            if self._free or self.sig is None or not self.nbytes or (self.sets + 1) * self.nbytes > self.memory:
                return
            self.sets += 1
            sig = self.sig
        spare = _BufferSet(_template_tensors(self.template))
        torch._foreach_zero_(spare)  # touch every page now, on the writer
        self._give(spare, sig)


class _BufferSet(list):
    """One snapshot's worth of a TreeCache's buffers, with their byte views made once: a
    tensor-to-memoryview conversion costs ~25 us of the writer's time (with the GIL held)."""

    _views: list[memoryview] | None = None
    _nbytes: int | None = None

    @property
    def nbytes(self) -> int:
        if self._nbytes is None:
            self._nbytes = sum(t.numel() * t.element_size() for t in self)
        return self._nbytes

    def views(self) -> list[memoryview]:
        if self._views is None:
            self._views = [_tensor_bytes(t) for t in self]
        return self._views


def _template_tensors(node: Any) -> list[torch.Tensor]:
    """Fresh buffers for the tensors of a template, in walk order."""
    nodes: list[dict] = []
    _build(node, itertools.repeat(None), nodes)
    return [_empty_like(n["shape"], _TORCH_DTYPES[n["dtype"]]) for n in nodes]


def _json_or_none(node: Any) -> str | None:
    try:
        return json.dumps(node, sort_keys=True, allow_nan=False)
    except ValueError:
        return None


_STREAMS: dict[Any, Any] = {}


def _side_stream(device: torch.device) -> Any:
    if device not in _STREAMS:
        _STREAMS[device] = torch.cuda.Stream(device=device)
    return _STREAMS[device]


# -- RNG ---------------------------------------------------------------------------------


#: about the bytes one capture_rng() holds on the CPU (Python 2.5 kB, NumPy 2.5 kB, torch 5 kB)
RNG_BYTES = 10_000


def capture_rng(like: Any = None) -> dict:
    """The global generators' states: Python, NumPy, torch CPU and every initialized CUDA device.

    Python's Mersenne Twister state (625 words) is kept as raw little-endian bytes, a leaf of
    2.5 kB rather than 625 JSON numbers; ``like``, a recorded RNG tree of a flor that kept the
    numbers, makes this capture keep them too, so the two compare.
    """
    version, words, gauss = random.getstate()
    if not _python_words_listed(like):
        packed = array.array("I", words)
        if sys.byteorder == "big":
            packed.byteswap()
        words = packed.tobytes()  # type: ignore[assignment]
    state: dict[str, Any] = {
        "python": (version, words, gauss),
        "numpy": np.random.get_state(legacy=False),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Any) -> None:
    """Set the global generators; called last, after every object is restored."""
    if not isinstance(state, dict) or not {"python", "numpy", "torch"} <= set(state):
        raise StateError("the recorded random state lacks the python, numpy or torch generator; the checkpoint "
                         "is damaged")
    try:
        random.setstate(_python_state(state["python"]))
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
    except Exception as exc:  # noqa: BLE001 - a damaged state is named, whatever the generator raises
        raise StateError(f"the recorded random state cannot be set ({type(exc).__name__}: {exc}); the checkpoint "
                         "is damaged") from exc
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if not isinstance(cuda, (list, tuple)) or len(cuda) != torch.cuda.device_count():
            raise StateError(
                f"the recording saw {len(cuda) if isinstance(cuda, (list, tuple)) else '?'} CUDA devices, this "
                f"process sees {torch.cuda.device_count()}; replay with the same CUDA_VISIBLE_DEVICES count"
            )
        try:
            torch.cuda.set_rng_state_all(cuda)
        except Exception as exc:  # noqa: BLE001
            raise StateError(f"the recorded CUDA random state cannot be set ({exc}); the checkpoint is damaged") from exc


def _python_words_listed(tree: Any) -> bool:
    """Whether a recorded RNG tree keeps Python's state words as a list of numbers (older flor)."""
    try:
        node = tree["v"][tree["k"].index("python")]["v"][1]
    except (TypeError, KeyError, ValueError, IndexError):
        return False
    return isinstance(node, dict) and node.get("t") in ("tuple", "list")


def _python_state(value: Any) -> tuple:
    """``random.setstate``'s argument from a captured state (words as raw bytes, or numbers)."""
    if isinstance(value, (list, tuple)) and len(value) == 3 and isinstance(value[1], (bytes, bytearray)):
        words = array.array("I")
        if words.itemsize != 4 or len(value[1]) % 4:
            raise StateError("the recorded Python random state is not a whole number of 32-bit words; the "
                             "checkpoint is damaged")
        words.frombytes(bytes(value[1]))
        if sys.byteorder == "big":
            words.byteswap()
        return (value[0], tuple(words), value[2])
    return _as_tuple(value)


def _as_tuple(x: Any) -> Any:
    return tuple(_as_tuple(i) for i in x) if isinstance(x, (list, tuple)) else x


# -- decode and restore ------------------------------------------------------------------

Loader = Callable[[str], bytes]
_TORCH_DTYPES: dict[str, torch.dtype] = {n: getattr(torch, n) for n in TORCH_DTYPES if hasattr(torch, n)}
_DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "hpu", "npu")


def _torch_dtype(name: Any, path: str) -> torch.dtype:
    dtype = _TORCH_DTYPES.get(name) if isinstance(name, str) else None
    if dtype is None:
        raise CheckpointError(f"{path or 'a tensor'}: dtype {name!r:.40} is not one flor stores; the checkpoint "
                              "is damaged")
    return dtype


def _np_dtype(text: Any, path: str) -> np.dtype:
    try:
        dtype = np.dtype(text) if isinstance(text, str) and len(text) <= 16 else None
    except (TypeError, ValueError):
        dtype = None
    if dtype is None or dtype.kind not in NP_KINDS or dtype.hasobject or dtype.fields is not None \
            or dtype.subdtype is not None:
        raise CheckpointError(f"{path or 'an array'}: numpy dtype {text!r:.40} is not one flor stores; the "
                              "checkpoint is damaged")
    return dtype


def _sized(node: dict, itemsize: int, data: bytes, path: str) -> list[int]:
    """The node's shape, once it is checked against the blob it describes."""
    shape = node.get("shape")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape) or len(shape) > 64:
        raise CheckpointError(f"{path or 'a tensor'}: shape {shape!r:.60} is not a list of sizes; the checkpoint "
                              "is damaged")
    numel = 1
    for d in shape:
        numel *= d
    if numel * itemsize != len(data):
        raise CheckpointError(f"{path or 'a tensor'}: shape {shape} of {itemsize}-byte items needs "
                              f"{numel * itemsize} bytes, its blob has {len(data)}; the checkpoint is damaged")
    return shape


def _leaf_bytes(node: dict, load: Loader, path: str) -> bytes:
    """A leaf's bytes: its blob, or its slice of a pack (``"o"``, ``"n"``; see ``hash_and_pack``)."""
    data = load(node["h"])
    if "o" not in node and "n" not in node:
        return data
    off, n = node.get("o"), node.get("n")
    if type(off) is not int or type(n) is not int or off < 0 or n < 0 or off + n > len(data):
        raise CheckpointError(f"{path or 'a leaf'}: offset {off!r:.20} and size {n!r:.20} do not lie inside its "
                              f"{len(data)}-byte pack; the checkpoint is damaged")
    return data[off:off + n]


def _decode_tensor(node: dict, load: Loader, *, to_device: bool, path: str = "") -> torch.Tensor:
    dtype = _torch_dtype(node.get("dtype"), path)
    data = _leaf_bytes(node, load, path)
    shape = _sized(node, torch.empty(0, dtype=dtype).element_size(), data, path)
    if len(data) == 0:
        t = torch.empty(shape, dtype=dtype)
    else:
        t = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)
    device = node.get("device", "cpu")
    if to_device and device != "cpu":
        if not isinstance(device, str) or device.partition(":")[0] not in _DEVICE_TYPES:
            raise CheckpointError(f"{path or 'a tensor'}: device {device!r:.40} is not a device; the checkpoint is "
                                  "damaged")
        try:
            t = t.to(device)
        except (RuntimeError, AssertionError) as exc:
            raise StateError(
                f"a tensor was recorded on {device}, which this process cannot use ({exc}); "
                "replay on a machine with that device"
            ) from exc
    if node.get("rg") is True and (t.is_floating_point() or t.is_complex()):
        t.requires_grad_(True)
    return t


def _unpickle(node: dict, load: Loader, path: str, pickles: PickleTrust) -> Any:
    pickles.check(path, str(node.get("cls")))  # before its bytes are even fetched
    data = _leaf_bytes(node, load, path)
    if hashlib.sha256(data).hexdigest() != node.get("sha256"):
        raise CheckpointError(f"{path or 'a leaf'}: the pickled {node.get('cls')}'s bytes do not match the SHA-256 "
                              "its manifest names; not loaded")
    import cloudpickle

    return cloudpickle.loads(data)  # allowed: the manifest is signed with our key, or the user opted in


def decode(node: Any, load: Loader, *, to_device: bool = False, path: str = "",
           pickles: PickleTrust = REFUSE_PICKLES) -> Any:
    """Rebuild plain values from a node (tensors on CPU unless ``to_device``).

    Pickled leaves load only as ``pickles`` allows; a damaged node is a StateError or
    CheckpointError naming ``path``.
    """
    try:
        return _decode(node, load, to_device, path, pickles)
    except FlorError:
        raise
    except Exception as exc:  # noqa: BLE001 - data from a store: whatever it makes fail is named
        raise StateError(f"cannot decode {path or 'a value'} ({type(exc).__name__}: {exc}); the checkpoint is "
                         "damaged, or from another flor") from exc


def _decode(node: Any, load: Loader, to_device: bool, path: str, pickles: PickleTrust, live: Any = None) -> Any:
    if not isinstance(node, dict):
        return node
    kind = node["t"]
    if kind in ("list", "tuple", "set", "frozenset"):
        items = [_decode(x, load, to_device, f"{path}[{i}]", pickles) for i, x in enumerate(node["v"])]
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[kind](items)
    if kind in ("dict", "odict"):
        out = (OrderedDict if kind == "odict" else dict)(
            (_decode(k, load, to_device, f"{path}.<key>", pickles), _decode(v, load, to_device, f"{path}.{k}", pickles))
            for k, v in zip(node["k"], node["v"])
        )
        if "meta" in node:
            out._metadata = _decode(node["meta"], load, False, path, pickles)  # type: ignore[attr-defined]
        return out
    if kind == "tensor":
        return _decode_tensor(node, load, to_device=to_device, path=path)
    if kind == "ndarray":
        dtype = _np_dtype(node.get("dtype"), path)
        data = _leaf_bytes(node, load, path)
        return np.frombuffer(bytearray(data), dtype=dtype).reshape(_sized(node, dtype.itemsize, data, path)).copy()
    if kind == "npscalar":
        dtype = _np_dtype(node.get("dtype"), path)
        if dtype.kind in "mM":
            return np.array(int(node["v"]), dtype=np.int64).view(dtype)[()]
        return dtype.type(_decode(node["v"], load, False, path, pickles))
    if kind in LEAF_KINDS:
        return decode_leaf(node, live, path)
    if kind in ("bytes", "bytearray"):
        return (bytes if kind == "bytes" else bytearray)(_leaf_bytes(node, load, path))
    if kind == "torchdtype":
        return _torch_dtype(node["v"], path)
    if kind == "torchdevice":
        if not isinstance(node["v"], str) or node["v"].partition(":")[0] not in _DEVICE_TYPES:
            raise CheckpointError(f"{path}: {node['v']!r:.40} is not a device; the checkpoint is damaged")
        return torch.device(node["v"])
    if kind == "npdtype":
        return _np_dtype(node["v"], path)
    if kind == "namedtuple":
        cls = find_class(node["cls"], live, lambda c: issubclass(c, tuple) and hasattr(c, "_fields"), path)
        old = live if isinstance(live, tuple) else ()
        items = [_restore(old[i] if i < len(old) else None, n, load, f"{path}.{k}", pickles)
                 for i, (k, n) in enumerate(zip(node["k"], node["v"]))]
        return tuple.__new__(cls, items)
    if kind == "dataclass":
        cls = find_class(node["cls"], live, dataclasses.is_dataclass, path)
        return _fill(cls.__new__(cls), node, load, path, pickles, in_place=False)
    if kind == "npgenerator":
        state = _decode(node["v"], load, False, path, pickles)
        name = state.get("bit_generator") if isinstance(state, dict) else None
        if name not in NP_BITGENS:
            raise CheckpointError(f"{path}: bit generator {name!r:.40} is not a numpy one; the checkpoint is damaged")
        gen = np.random.Generator(getattr(np.random, name)())
        gen.bit_generator.state = state
        return gen
    if kind == "npbitgen":
        if node.get("cls") not in NP_BITGENS:
            raise CheckpointError(f"{path}: bit generator {node.get('cls')!r:.40} is not a numpy one")
        bitgen = getattr(np.random, node["cls"])()
        bitgen.state = _decode(node["v"], load, False, path, pickles)
        return bitgen
    if kind == "pickle":
        return _unpickle(node, load, path, pickles)
    raise StateError(f"cannot decode a {kind!r:.40} node outside a live object ({path or 'a value'}); the "
                     "checkpoint is from another flor, or damaged")


def _fill(target: Any, node: dict, load: Loader, path: str, pickles: PickleTrust, *, in_place: bool) -> Any:
    """Set the attributes of an ``object``/``dataclass`` node on ``target``: through its own
    ``setattr`` in place, or with ``object.__setattr__`` on a new (maybe frozen) instance."""
    attrs = node["v"]
    for k_node, v_node in zip(attrs["k"], attrs["v"]):
        if not isinstance(k_node, str):
            raise CheckpointError(f"{path}: attribute name {k_node!r:.40} is not a string; the checkpoint is damaged")
        value = _restore(getattr(target, k_node, None) if in_place else None, v_node, load, f"{path}.{k_node}",
                         pickles)
        (setattr if in_place else object.__setattr__)(target, k_node, value)
    return target


def restore(live: Any, node: Any, load: Loader, path: str = "", *, pickles: PickleTrust = REFUSE_PICKLES) -> Any:
    """Put the state in ``node`` back into ``live`` in place where it can; return the result.

    Mutable objects come back as the same objects; immutable values come back as new ones.
    Pickled leaves load only as ``pickles`` allows.
    """
    return _restore(live, node, load, path, pickles)


def _restore(live: Any, node: Any, load: Loader, path: str, pickles: PickleTrust) -> Any:
    if not isinstance(node, dict):
        return node
    kind = node.get("t")
    try:
        if kind == "stateful":
            if not callable(getattr(live, "load_state_dict", None)):
                raise StateError(
                    f"{path} was recorded as a {node['cls']} with state_dict(); now it is a "
                    f"{_qualname(live)}: pass SkipBlock.end the same objects, in the same order, as when recording"
                )
            live.load_state_dict(_decode(node["v"], load, False, path, pickles))
            return live
        if kind == "tensor":
            value = _decode_tensor(node, load, to_device=True, path=path)
            if isinstance(live, torch.Tensor) and live.shape == value.shape and live.dtype == value.dtype:
                with torch.no_grad():
                    live.copy_(value)
                return live
            return value
        if kind == "list":
            items = [_restore(live[i] if isinstance(live, list) and i < len(live) else None, n, load, f"{path}[{i}]",
                              pickles) for i, n in enumerate(node["v"])]
            if isinstance(live, list):
                live[:] = items
                return live
            return items
        if kind == "tuple":
            old = live if isinstance(live, tuple) else ()
            return tuple(_restore(old[i] if i < len(old) else None, n, load, f"{path}[{i}]", pickles)
                         for i, n in enumerate(node["v"]))
        if kind == "set" and type(live) is set:
            live.clear()
            live.update(_decode(node, load, True, path, pickles))
            return live
        if kind == "bytearray" and type(live) is bytearray:
            live[:] = _leaf_bytes(node, load, path)
            return live
        if kind in ("dict", "odict"):
            keys = [_decode(k, load, False, f"{path}.<key>", pickles) for k in node["k"]]
            old = live if isinstance(live, dict) else {}
            values = [_restore(old.get(k), n, load, f"{path}.{k}", pickles) for k, n in zip(keys, node["v"])]
            if isinstance(live, dict):
                live.clear()
                live.update(zip(keys, values))
                return live
            return _decode(node, load, True, path, pickles)
        if kind == "generator":
            state = _decode_tensor(node["v"], load, to_device=False, path=path)
            if isinstance(live, torch.Generator):
                live.set_state(state)
                return live
            gen = torch.Generator(device=node["device"])
            gen.set_state(state)
            return gen
        if kind == "pyrandom":
            target = live if isinstance(live, random.Random) else random.Random()
            target.setstate(_as_tuple(_decode(node["v"], load, False, path, pickles)))
            return target
        if kind == "nprandomstate":
            target = live if isinstance(live, np.random.RandomState) else np.random.RandomState()
            target.set_state(_decode(node["v"], load, False, path, pickles))
            return target
        if kind == "npgenerator" and isinstance(live, np.random.Generator):
            live.bit_generator.state = _decode(node["v"], load, False, path, pickles)
            return live
        if kind == "npbitgen" and type(live).__name__ == node.get("cls") and isinstance(live, np.random.BitGenerator):
            live.state = _decode(node["v"], load, False, path, pickles)
            return live
        if kind == "dataclass" and live is not None and _qualname(live) == node["cls"] \
                and dataclasses.is_dataclass(live) and not type(live).__dataclass_params__.frozen:
            return _fill(live, node, load, path, pickles, in_place=True)
        if kind == "object":
            if live is None or not hasattr(live, "__dict__"):
                raise StateError(
                    f"{path} was recorded as a {node['cls']} but is now {live!r:.80}: pass SkipBlock.end "
                    "the same objects, in the same order, as when recording"
                )
            return _fill(live, node, load, path, pickles, in_place=True)
        return _decode(node, load, True, path, pickles, live)
    except FlorError:
        raise
    except Exception as exc:  # noqa: BLE001 - user objects' load_state_dict, or damaged data: named either way
        raise StateError(
            f"cannot restore {path or 'an object'} ({node.get('cls', kind)}): {type(exc).__name__}: {exc}; was the "
            "object built differently from the recording (architecture, parameter groups)?"
        ) from exc


def restore_all(objs: list, objects: Any, rng: Any, load: Loader, *, pickles: PickleTrust = REFUSE_PICKLES) -> list:
    """Restore ``objs`` from ``objects`` in place, then the global RNGs from ``rng``.

    RNG state goes last: restoring an object may itself draw random numbers (a sampler
    re-seeding, a module re-initializing), and those draws must not leak into training.
    """
    restored = _restore(objs, objects, load, "", pickles)
    restore_rng(decode(rng, load, path="rng", pickles=pickles))
    return restored


# -- comparing ---------------------------------------------------------------------------

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
        if a["t"] in ("dict", "odict", "object", "stateful", "dataclass") and isinstance(a.get("v"), (dict, list)):
            if a["t"] in ("object", "stateful", "dataclass"):
                return diff_nodes(a["v"], b["v"], path)
            ka, kb = a["k"], b["k"]
            if ka != kb:
                return [f"{path}.<keys>"]
            for k, va, vb in zip(ka, a["v"], b["v"]):
                out += diff_nodes(va, vb, f"{path}.{k}" if path else str(k))
            return out
        if a["t"] in ("list", "tuple", "namedtuple"):
            if len(a["v"]) != len(b["v"]):
                return [f"{path}.<length>"]
            for i, (va, vb) in enumerate(zip(a["v"], b["v"])):
                out += diff_nodes(va, vb, f"{path}[{i}]")
            return out
        return out + diff_nodes(a.get("v"), b.get("v"), path)
    return [] if same_value(a, b, exact_type=True) else [path or "<root>"]
