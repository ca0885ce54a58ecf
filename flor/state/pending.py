"""A snapshot on its way to the store: the buffers it was copied into (``BufferPool``), the
captured tree whose leaves still need hashing (``Pending``), and the packing of a
checkpoint's leaves into blobs (``hash_and_pack``), which runs on the background writer.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..store.hashing import hash_bytes
from ..store.local import DIRECT_MIN, PAGE, address
from ..store.writer import give_turn
from ..store.manifest import canonical_json

__all__ = ["BufferPool", "PACK_ALL_BYTES", "PACK_LEAF_BYTES", "PackIndex", "Pending", "empty_buffers_like",
           "hash_and_pack", "is_plain_tensor", "side_stream", "tensor_bytes"]


#: dtypes NumPy has: their tensors' bytes are one ``numpy()`` away (~3 us rather than ~8 us
#: through ``reshape``/``view``; the writer takes 40-odd of these per checkpoint, issue #13)
_NUMPY_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                           torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128})


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous CPU tensor, without a copy."""
    if t.numel() == 0:
        return memoryview(b"")
    if t.dtype in _NUMPY_DTYPES and not t.requires_grad and t.is_contiguous() and not t.is_conj() and not t.is_neg():
        # ndarray.data is memoryview(ndarray); numpy's stubs declare ndarray.__buffer__ for Python 3.12+ only
        return t.numpy().data.cast("B")
    return t.reshape(-1).view(torch.uint8).numpy().data


def _aligned_empty(nbytes: int) -> torch.Tensor:
    """An uninitialized ``uint8`` buffer; page-aligned when it is large enough for the store to
    write it around the page cache (``flor.store.local.DIRECT_MIN``)."""
    if nbytes < DIRECT_MIN:
        return torch.empty(nbytes, dtype=torch.uint8)
    raw = torch.empty(nbytes + PAGE, dtype=torch.uint8)
    start = -raw.data_ptr() % PAGE
    return raw[start:start + nbytes]


def empty_buffers_like(shape: Any, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized contiguous CPU tensor, in an ``_aligned_empty`` buffer."""
    shape = [int(d) for d in shape]
    nbytes = torch.Size(shape).numel() * dtype.itemsize
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    return _aligned_empty(nbytes).view(dtype).view(shape)


def is_plain_tensor(t: torch.Tensor) -> bool:
    return t.layout == torch.strided and not t.is_quantized and not t.is_nested


class BufferPool:
    """Reusable host buffers for snapshots, keyed by size.

    Copying into memory that was already touched runs at memcpy speed; a fresh allocation
    pays page faults on every epoch (measured here: 9-12 GB/s vs 0.85-2.7 GB/s). Buffers
    for CUDA tensors are pinned, so device-to-host copies can run asynchronously.

    The pool remembers which buffers it pinned rather than asking ``Tensor.is_pinned()``: on
    a machine with a GPU that asks the CUDA driver about the pointer, which in some torch
    releases initializes CUDA (a context on the GPU, and forked DataLoader workers that can
    no longer use it) in a process that trains on the CPU.
    """

    def __init__(self) -> None:
        self._free: dict[tuple[int, bool], list[torch.Tensor]] = {}
        # id -> made pinned
        self._pinned: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()

    def take(self, nbytes: int, *, pinned: bool = False) -> torch.Tensor:
        with self._lock:
            free = self._free.get((nbytes, pinned))
            if free:
                return free.pop()
        if not pinned:
            return _aligned_empty(nbytes)
        buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        with self._lock:
            self._pinned[id(buf)] = buf
        return buf

    def give(self, buffers: list[torch.Tensor]) -> None:
        with self._lock:
            for buf in buffers:
                self._free.setdefault((buf.numel(), self._pinned.get(id(buf)) is buf), []).append(buf)

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
    buffer_set: Any = None  # the TreeCache buffer set (flor.state.cache) ``tensors`` are: its byte views, its size
    render: Callable[[list[dict]], str | None] | None = None  # the tree's canonical JSON from a TreeCache template
    light: list[dict] | None = None  # with ``render``: the tensor nodes the writer fills, the tree not built
    copy_s: float = 0.0  # on the fast path: the time the tensor copies took (the rest of a snapshot is fixed cost)
    #: how the snapshot was made: "fast" (a TreeCache template reused), "learned" (the fast walk,
    #: checked against the full encoding: a template made), "full" (the full encoding, with copies)
    encoded: str = "full"

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
            if self.light is not None:  # what the writer noted on the light nodes (hashes, pack places)
                for node, light in zip(nodes, self.light):
                    node.update((k, v) for k, v in light.items() if k != "t")
                self.light = None
            if self.tensors:
                self.tensors = [(node, data) for node, (_, data) in zip(nodes, self.tensors)]
            self.build = None
        return self.tree

    def canonical(self) -> str:
        """The tree's canonical JSON (``flor.store.manifest.canonical_json``). On the fast path
        it is rendered from the TreeCache's template, the values and the hashes, without
        building the tree (which, with its serialization, cost the writer ~0.5 ms per
        checkpoint of the digits CNN, issue #13)."""
        if self.build is not None and self.render is not None and self.light is not None:
            text = self.render(self.light)
            if text is not None:
                return text
        return canonical_json(self.built())

    def leaves(self) -> list[tuple[dict, memoryview | bytes]]:
        """``(node, bytes)`` of every leaf to store, views of the pooled buffers (no copy)."""
        if self.ready is not None:
            self.ready.synchronize()
        if self.build is not None and self.render is not None:
            if self.light is None:  # light nodes: ``canonical`` renders them, ``built`` merges them
                self.light = [{"t": "tensor"} for _ in self.tensors]
                self.tensors = [(node, data) for node, (_, data) in zip(self.light, self.tensors)]
        else:
            self.built()
        if self.buffer_set is not None:
            views = self.buffer_set.views()
            return [(node, view) for (node, _), view in zip(self.tensors, views)] + list(self.raw)
        return [(node, tensor_bytes(tensor)) for node, tensor in self.tensors] + list(self.raw)

    def release(self) -> None:
        """Give the pooled buffers back (after their bytes are stored); the tree stays."""
        if self.light is None:
            self.built()  # the tree stays: make it before the buffers go (light nodes keep what it needs)
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
        return self.built()


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

    It also lends the buffer a pack is assembled in (``lend``), page-aligned and touched
    already, until ``give_back``: a fresh one per checkpoint page-faulted on every one of its
    pages (~0.2 ms for the digits CNN's 1 MB pack, holding the GIL, issue #13).
    """

    def __init__(self, limit: int = 1 << 17) -> None:
        self.where: dict[str, tuple[str, int, int]] = {}
        self.limit = limit
        self._buffer: torch.Tensor | None = None
        self._lent = False

    def lend(self, size: int) -> memoryview | None:
        """``size`` bytes of the pack buffer, or None while it is lent (or too small to write
        around the page cache: ``b"".join`` is as good there)."""
        if self._lent or size < DIRECT_MIN:
            return None
        if self._buffer is None or self._buffer.numel() < size:
            self._buffer = _aligned_empty(size + size // 8)  # room for a pack that grows a little
        self._lent = True
        return tensor_bytes(self._buffer[:size])

    def give_back(self) -> None:
        """The pack lent last is written (or its write failed): its buffer may be reused."""
        self._lent = False

    def remember(self, entries: dict[str, tuple[str, int, int]]) -> None:
        if len(self.where) + len(entries) > self.limit:
            self.where.clear()
        self.where.update(entries)


#: hashing this many bytes or more is timed for ``hash_and_pack``'s ``nogil``
NOGIL_HASH_BYTES = 64 * 1024


def hash_and_pack(parts: list[Pending], index: PackIndex | None = None, threshold: int = PACK_LEAF_BYTES,
                  pack_all: int = PACK_ALL_BYTES,
                  nogil: list[float] | None = None) -> tuple[list[tuple[memoryview | bytes, str]], dict]:
    """Hash every leaf of ``parts`` once and note where its bytes go in its node; return the
    ``(bytes, hash)`` blobs to store and the index entries to ``remember`` once they are.

    A leaf of ``threshold`` bytes or more is its own blob (``"h"``: its hash; deduplicated
    across runs), unless all the leaves together are at most ``pack_all`` bytes. A smaller one
    points into a pack: ``"h"`` the pack's hash, ``"o"``/``"n"`` its offset and size there,
    ``"x"`` its own hash (what comparisons use). Runs on the background writer; the large
    blobs are still views of the pooled buffers (no copy); a pack large enough to be written
    around the page cache is assembled in a page-aligned buffer.

    ``nogil``, where given, gets the thread CPU time of the hashes of ``NOGIL_HASH_BYTES`` or
    more appended: xxhash releases the GIL while it hashes, so that time is not taken from a
    training thread (the recorder's budget charge, ``flor.policy``).
    """
    blobs: list[tuple[memoryview | bytes, str]] = []
    small: list[tuple[dict, memoryview | bytes, int, str]] = []
    leaves = [(node, data, len(data) if type(data) is bytes else memoryview(data).nbytes)
              for part in parts for node, data in part.leaves()]
    if sum(n for _, _, n in leaves) <= pack_all:
        threshold = pack_all + 1
    for node, data, nbytes in leaves:
        give_turn()
        digest = _hash(data, nbytes, nogil)
        if node["t"] == "pickle":  # signed with the manifest: a blob hash alone is easy to forge
            node["sha256"] = hashlib.sha256(data).hexdigest()
        if nbytes >= threshold:
            node["h"] = digest
            blobs.append((data, digest))
        else:
            small.append((node, data, nbytes, digest))
    known = index.where if index is not None else {}
    chunks: list[memoryview | bytes] = []
    offsets: dict[str, tuple[int, int]] = {}
    size = 0
    for _, data, n, digest in small:
        if digest not in known and digest not in offsets:
            offsets[digest] = (size, n)
            chunks.append(data)
            size += n
    entries: dict[str, tuple[str, int, int]] = {}
    if chunks:
        pack = _joined(chunks, size, index.lend(size) if index is not None else None, nogil)
        pack_hash = _hash(pack, size, nogil)
        blobs.append((pack, pack_hash))
        entries = {d: (pack_hash, o, n) for d, (o, n) in offsets.items()}
    for node, _, _, digest in small:
        where = entries.get(digest) or known[digest]
        node["h"], node["o"], node["n"], node["x"] = where[0], where[1], where[2], digest
    return blobs, entries


def _hash(data: memoryview | bytes, nbytes: int, nogil: list[float] | None) -> str:
    """``hash_bytes(data)``; its thread CPU time appended to ``nogil`` where given and
    ``nbytes`` is at least ``NOGIL_HASH_BYTES``."""
    if nogil is None or nbytes < NOGIL_HASH_BYTES:
        return hash_bytes(data)
    t0 = time.thread_time()
    digest = hash_bytes(data)
    nogil.append(time.thread_time() - t0)
    return digest


#: a chunk this large is copied into its pack by ``memmove`` with the GIL released
NOGIL_COPY_BYTES = 64 * 1024


def _joined(chunks: list[memoryview | bytes], size: int, into: memoryview | None = None,
            nogil: list[float] | None = None) -> memoryview | bytes:
    """The chunks one after the other: in ``into`` (``PackIndex.lend``) where given; else in a
    page-aligned buffer where the store writes it around the page cache (a buffered write
    costs the writer 2-4 CPU-s per GB).

    Chunks of ``NOGIL_COPY_BYTES`` or more (a writable buffer: the pooled snapshot buffers)
    are copied with ``ctypes.memmove``, which releases the GIL, and its thread CPU time goes
    to ``nogil`` where given: a memoryview slice assignment holds the GIL the training thread
    needs, ~0.1-0.25 ms per checkpoint of the digits CNN (issue #13). Not with a torch copy:
    a parallel one gives the writer thread its own OpenMP team (flor.state.cache._touch).

    >>> big, small, n = memoryview(bytearray(b"a" * NOGIL_COPY_BYTES)), b"bc", NOGIL_COPY_BYTES + 4
    >>> bytes(_joined([small, big, small], n, memoryview(bytearray(n)))) == b"bc" + bytes(big) + b"bc"
    True
    """
    if into is None:
        if size < DIRECT_MIN:
            return b"".join(chunks)
        into = tensor_bytes(_aligned_empty(size))
    base = address(into)  # None where read-only
    at = 0
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        n = view.nbytes
        src = address(view) if n >= NOGIL_COPY_BYTES and base is not None else None
        if src is not None and base is not None:
            t0 = time.thread_time()
            ctypes.memmove(base + at, src, n)
            if nogil is not None:
                nogil.append(time.thread_time() - t0)
        else:
            into[at:at + n] = view
        at += n
    return into


_STREAMS: dict[Any, Any] = {}


def side_stream(device: torch.device) -> Any:
    """The stream a snapshot's device-to-host copies run on, one per device."""
    if device not in _STREAMS:
        _STREAMS[device] = torch.cuda.Stream(device=device)
    return _STREAMS[device]
