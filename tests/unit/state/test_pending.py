"""flor.state.pending: snapshots on their way to the writer. Pooled buffers are reused and stay
exact; a checkpoint's small leaves share one pack, each found again by offset and size (an
unchanged one points into the earlier pack); hashing and packing large leaves release the GIL,
so that time is not charged.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

from flor.errors import CheckpointError
from flor.state import PackIndex, diff_nodes, hash_and_pack, restore, snapshot
from flor.store.local import DIRECT_MIN, PAGE, address
from flor.store.manifest import check_node

from helpers import make_training, train_steps


class MemoryBlobs(dict):
    def put(self, data, digest):
        self[digest] = bytes(data)


def test_pooled_snapshots_reuse_buffers_and_stay_exact():
    from flor.state import BufferPool

    pool = BufferPool()
    net = torch.nn.Linear(64, 32)
    first = snapshot([net], pool=pool)
    buffers = {b.data_ptr() for b in first.buffers}
    blobs = MemoryBlobs()
    tree1 = first.materialize(blobs.put)
    assert pool.nbytes == sum(p.numel() * 4 for p in net.parameters())  # back in the pool
    with torch.no_grad():
        net.weight += 1
    second = snapshot([net], pool=pool)
    assert {b.data_ptr() for b in second.buffers} == buffers  # the same memory, no new allocation
    with torch.no_grad():
        net.weight -= 1  # training goes on: the snapshot must hold the values at end() time
    tree2 = second.materialize(blobs.put)
    assert diff_nodes(tree1, tree2) == ["[0].weight"]
    restored = restore([torch.nn.Linear(64, 32)], tree2, blobs.__getitem__)[0]
    assert torch.equal(restored.weight, net.weight + 1) and torch.equal(restored.bias, net.bias)


def test_the_pool_never_asks_torch_whether_a_buffer_is_pinned(monkeypatch):
    """On a GPU machine ``Tensor.is_pinned()`` asks the CUDA driver, which in some torch
    releases initializes CUDA in a process that trains on the CPU; the pool knows which
    buffers it pinned."""
    from flor.state import BufferPool

    def asked(self, *args, **kwargs):
        raise AssertionError("BufferPool asked torch whether a buffer is pinned")

    pool = BufferPool()
    net = torch.nn.Linear(64, 32)
    first = snapshot([net], pool=pool)
    buffers = {b.data_ptr() for b in first.buffers}
    monkeypatch.setattr(torch.Tensor, "is_pinned", asked)
    first.materialize(MemoryBlobs().put)  # gives its buffers back
    monkeypatch.undo()
    assert {b.data_ptr() for b in snapshot([net], pool=pool).buffers} == buffers  # reused as unpinned buffers
    assert pool.nbytes == 0


def full(objs) -> dict:
    return json.loads(json.dumps(snapshot(objs, copy=False).materialize()))


def test_small_leaves_share_a_pack_and_are_found_again():
    net, opt, sched, scaler = make_training()
    train_steps(net, opt, sched, n=2)
    index = PackIndex()
    p1 = snapshot([net, opt, sched], copy=False)
    blobs, entries = hash_and_pack([p1], index, threshold=100, pack_all=0)
    store = {d: bytes(b) for b, d in blobs}
    index.remember(entries)
    tree = p1.tree
    leaves = [n for n in _tensor_nodes(tree)]
    packed = [n for n in leaves if "o" in n]
    assert packed and len({n["h"] for n in packed}) == 1, "every small leaf in one pack"
    assert all(n["n"] < 100 for n in packed) and all("o" not in n for n in leaves if n not in packed)
    check_node(json.loads(json.dumps(tree)))
    net2, opt2, sched2, _ = make_training()
    restore([net2, opt2, sched2], tree, store.__getitem__)
    assert diff_nodes(full([net, opt, sched]), full([net2, opt2, sched2])) == []
    # nothing changed: the next checkpoint writes no pack, its leaves point into the first
    p2 = snapshot([net, opt, sched], copy=False)
    blobs2, entries2 = hash_and_pack([p2], index, threshold=100, pack_all=0)
    assert entries2 == {} and all(d in store for _, d in blobs2)
    assert json.dumps(p2.tree) == json.dumps(tree)
    # damaged offsets are named, not an IndexError or a short tensor
    bad = json.loads(json.dumps(tree))
    node = next(n for n in _tensor_nodes(bad) if "o" in n)
    node["o"] = 10**9
    with pytest.raises(CheckpointError, match="do not lie inside"):
        restore(list(make_training()[:3]), bad, store.__getitem__)
    node["o"] = -1
    with pytest.raises(Exception, match="offset"):
        check_node(bad)


def test_a_small_checkpoint_is_one_page_aligned_pack_and_a_frozen_leaf_is_stored_once():
    torch.manual_seed(0)
    frozen, head = torch.nn.Linear(256, 512), torch.nn.Linear(512, 10)  # a 512 KiB weight that never changes
    frozen.requires_grad_(False)
    opt = torch.optim.AdamW(head.parameters(), lr=0.1)
    head(frozen(torch.randn(4, 256))).sum().backward()
    opt.step()
    index = PackIndex()
    p1 = snapshot([frozen, head, opt], copy=False)
    blobs, entries = hash_and_pack([p1], index)
    assert len(blobs) == 1, "every leaf, the 512 KiB one too, in one pack"
    pack, digest = blobs[0]
    assert memoryview(pack).nbytes >= DIRECT_MIN and address(memoryview(pack)) % PAGE == 0  # written around the page cache
    store = {digest: bytes(pack)}
    index.remember(entries)
    assert all(n["h"] == digest and "o" in n for n in _tensor_nodes(p1.tree))
    frozen2, head2 = torch.nn.Linear(256, 512), torch.nn.Linear(512, 10)
    opt2 = torch.optim.AdamW(head2.parameters(), lr=0.1)
    restore([frozen2, head2, opt2], json.loads(json.dumps(p1.tree)), store.__getitem__)
    assert diff_nodes(full([frozen, head, opt]), full([frozen2, head2, opt2])) == []
    # the head trains on, the frozen layer does not: the next pack leaves its weight out
    head(frozen(torch.randn(4, 256))).sum().backward()
    opt.step()
    p2 = snapshot([frozen, head, opt], copy=False)
    blobs2, _ = hash_and_pack([p2], index)
    assert len(blobs2) == 1 and memoryview(blobs2[0][0]).nbytes < 300_000
    weight = p2.tree["v"][0]["v"]["v"][0]
    assert weight["h"] == digest, "the unchanged weight points into the first pack"
    # and past PACK_ALL_BYTES, large leaves are blobs of their own again
    blobs3, _ = hash_and_pack([snapshot([frozen, head, opt], copy=False)], PackIndex(), pack_all=1000)
    assert len(blobs3) > 1


def _nodes(node, keep):
    """Every dict of a node tree for which ``keep`` holds."""
    if isinstance(node, dict):
        if keep(node):
            yield node
        for v in node.values():
            yield from _nodes(v, keep)
    elif isinstance(node, list):
        for v in node:
            yield from _nodes(v, keep)


def _tensor_nodes(node):
    return _nodes(node, lambda n: n.get("t") == "tensor")


def test_hashing_is_not_charged_as_gil_time_because_xxhash_releases_the_gil():
    """The recorder leaves the writer's large hashes out of its GIL time (``hash_and_pack``'s
    ``nogil``): that holds only while xxhash releases the GIL as it hashes. A Python thread
    must run through most of a long hash; with the GIL held it could run only before the call
    began or after it returned (tried a few times: a busy machine may not schedule it)."""
    from flor.store.hashing import hash_bytes

    data = memoryview(bytes(256 << 20))
    for _ in range(5):
        stamps: list[float] = []
        stop = False

        def spin() -> None:
            while not stop:
                stamps.append(time.perf_counter())

        thread = threading.Thread(target=spin)
        thread.start()
        while not stamps:
            time.sleep(0.001)
        t0 = time.perf_counter()
        hash_bytes(data)
        t1 = time.perf_counter()
        stop = True
        thread.join()
        inside = [s for s in stamps if t0 < s < t1]
        if inside and inside[-1] - inside[0] > 0.5 * (t1 - t0):
            break
    else:
        pytest.fail("a Python thread did not run while xxhash hashed 256 MiB: it holds the GIL, so the "
                    "recorder must charge its hashing as GIL time (hash_and_pack's nogil)")


def test_hash_and_pack_times_only_the_large_hashes():
    big, small = torch.arange(40_000, dtype=torch.float32), torch.ones(10)
    nogil: list[float] = []
    hash_and_pack([snapshot([big, small], copy=False)], PackIndex(), nogil=nogil)
    assert len(nogil) == 2 and all(t >= 0 for t in nogil)  # the pack of both (160 KB) and big on its own
    nogil.clear()
    hash_and_pack([snapshot([small, small * 2], copy=False)], PackIndex(), nogil=nogil)
    assert nogil == []


def test_large_leaves_are_copied_into_a_pack_without_the_gil_and_that_time_is_not_charged():
    big = [torch.arange(40_000, dtype=torch.float32) + i for i in range(4)]  # 640 KB: one lent, page-aligned pack
    index, nogil = PackIndex(), []
    blobs, _ = hash_and_pack([snapshot(big, copy=False)], index, nogil=nogil)
    (pack, _), = blobs
    assert bytes(pack) == b"".join(t.numpy().tobytes() for t in big)
    assert len(nogil) == 4 + 4 + 1  # each leaf's hash, its memmove into the pack, the pack's hash
