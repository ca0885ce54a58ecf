"""Background CPU per GB written against the floor: write+fsync and xxh3 hashing of the same bytes.

Three measures in one run, all as CPU-seconds of the thread doing the work (``time.thread_time``:
user + system, not the kernel's own writeback threads) per GB:

- ``floor``: the bytes of one checkpoint written to fresh files with one fsync each, plus xxh3-128
  over them (what a writer cannot avoid), measured on the checkpoints' own bytes;
- ``writer``: flor's writer path on the same tensors (snapshot into the pool on this thread, then
  on a writer thread: hash once, write straight from the pooled buffers, one durability barrier);
- ``recording``: a real recording of benchmarks/bench_train.py (the big MLP, a checkpoint at
  every epoch): run.json's ``background.cpu_s`` / ``bytes_written``.

    python benchmarks/writer_floor.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import torch
import xxhash

from common import TRAIN, env, median, run, run_meta, save, table

TARGET = 1.5  # CPU-s per GB, issue #13


def model_state(scale: float = 1.0) -> list:
    """The big MLP with AdamW state, ~126 MB (``scale`` shrinks it for --quick)."""
    torch.manual_seed(0)
    w = int(2048 * scale)
    net = torch.nn.Sequential(torch.nn.Linear(1024, w), torch.nn.ReLU(), torch.nn.Linear(w, w), torch.nn.ReLU(),
                              torch.nn.Linear(w, w), torch.nn.ReLU(), torch.nn.Linear(w, 10))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    net(torch.randn(8, 1024)).sum().backward()
    opt.step()
    return [net, opt]


def perturb(objs: list) -> None:
    """Change every tensor (weights and Adam's moments), so each checkpoint writes all its bytes."""
    with torch.no_grad():
        for p in objs[0].parameters():
            p.add_(1e-3)
        for state in objs[1].state.values():
            for t in state.values():
                if t.numel() > 1:
                    t.add_(1e-3)


def in_thread(fn) -> float:
    """CPU-seconds ``fn`` took on a thread of its own (as the background writer runs)."""
    out: list[float] = []

    def body() -> None:
        t0 = time.thread_time()
        fn()
        out.append(time.thread_time() - t0)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    return out[0]


def floor_probe(views: list[memoryview], folder: Path) -> dict:
    """write+fsync of each buffer to a fresh file, and xxh3-128 over each."""
    folder.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        for i, v in enumerate(views):
            fd = os.open(folder / f"f{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, v)
            os.fsync(fd)
            os.close(fd)

    def hashing() -> None:
        for v in views:
            xxhash.xxh3_128_hexdigest(v)

    w = in_thread(write)
    shutil.rmtree(folder)
    return {"write_fsync_cpu_s": w, "xxh3_cpu_s": in_thread(hashing)}


def writer_path(objs: list, root: Path, checkpoints: int) -> dict:
    from flor.state import BufferPool, capture_rng, snapshot
    from flor.store.blobs import BlobStore
    from flor.store.local import LocalBackend

    blobs, pool = BlobStore(LocalBackend(root)), BufferPool()
    cpu, written, floor = [], [], []
    for i in range(checkpoints):
        perturb(objs)
        parts = [snapshot(objs, pool=pool), snapshot(capture_rng())]
        views = [memoryview(t.reshape(-1).view(torch.uint8).numpy()) for _, t in parts[0].tensors if t.numel()]
        if i % 2 == 0:  # alternate which goes first: the page cache's state drifts
            probe = floor_probe(views, root / "probe")
            floor.append(probe["write_fsync_cpu_s"] + probe["xxh3_cpu_s"])
        new: list[int] = []

        def job() -> None:
            try:
                new.append(blobs.put_many([item for p in parts for item in p.hashed()]))
            finally:
                for p in parts:
                    p.release()

        cpu.append(in_thread(job))
        written.append(new[0])
        if i % 2 == 1:
            probe = floor_probe(views, root / "probe")
            floor.append(probe["write_fsync_cpu_s"] + probe["xxh3_cpu_s"])
    gb = sum(written) / 1e9
    per_gb = median(written) / 1e9
    return {"gb_written": gb, "writer_cpu_s": cpu, "floor_cpu_s": floor,
            "writer_cpu_s_per_gb": median(cpu) / per_gb, "floor_cpu_s_per_gb": median(floor) / per_gb,
            "note": "median over checkpoints of CPU-s per checkpoint / GB per checkpoint"}


def recording(tmp: Path, quick: bool) -> dict:
    home = tmp / "rec"
    args = [str(TRAIN), "--model", "big", "--epochs", "2" if quick else "6", "--steps", "4", "--batch", "32",
            "--flor", "floor"]
    run(args, env(home, FLOR_EVERY="1"))
    bg = run_meta(home, "floor")["background"]
    return {"cpu_s": bg["cpu_s"], "gb_written": bg["bytes_written"] / 1e9,
            "cpu_s_per_gb": bg["cpu_s"] / (bg["bytes_written"] / 1e9)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smaller model, fewer checkpoints: a smoke test")
    opts = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="flor-floor-"))
    try:
        objs = model_state(0.25 if opts.quick else 1.0)
        path = writer_path(objs, tmp / "store", 2 if opts.quick else 6)
        rec = recording(tmp, opts.quick)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = [["floor: write+fsync + xxh3 (same bytes)", path["floor_cpu_s_per_gb"]],
            ["flor writer path (same tensors)", path["writer_cpu_s_per_gb"]],
            ["real recording (run.json background)", rec["cpu_s_per_gb"]]]
    print(table(rows, ["background CPU-s per GB written", "CPU-s/GB"]))
    print(f"target <= {TARGET} CPU-s/GB: writer path {'met' if path['writer_cpu_s_per_gb'] <= TARGET else 'NOT met'}, "
          f"recording {'met' if rec['cpu_s_per_gb'] <= TARGET else 'NOT met'}")
    print("wrote", save("writer_floor", {"quick": opts.quick, "target_cpu_s_per_gb": TARGET,
                                         "writer_path": path, "recording": rec}))


if __name__ == "__main__":
    main()
