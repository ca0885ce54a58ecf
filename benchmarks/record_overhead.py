"""Record overhead: the same training with and without --flor, interleaved, two model sizes.

Reports end-to-end and in-loop overhead at the default budget and with a checkpoint forced
at every epoch, against plain and against plain with glibc's malloc thresholds raised as a
flor session raises them (``plain_raised``: flor.malloc; what remains is the checkpoints'
cost), the training-thread stall per checkpoint (and its GB/s next to a same-run memcpy probe
into reused vs fresh buffers, and each recording's own copy of the same tensors into reused
buffers after its loop: ``--memcpy-probe``), bytes written per epoch, and the background CPU
seconds per epoch that checkpointing costs on a machine without a GPU.

    python benchmarks/record_overhead.py [--reps 3] [--quick]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch

from common import TRAIN, interleaved, median, overheads, save, table

MODELS = {"cnn": ["--model", "cnn", "--epochs", "6", "--steps", "25"],
          "big": ["--model", "big", "--epochs", "5", "--steps", "12", "--batch", "32"]}


def memcpy_probe(nbytes: int, reps: int = 5) -> dict:
    """GB/s copying ``nbytes`` into a reused buffer vs into a fresh allocation."""
    src = torch.randn(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    reused, fresh = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src)
        reused.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        out = src.clone()
        fresh.append(time.perf_counter() - t0)
        del out
    return {"reused_gbps": nbytes / median(reused) / 1e9, "fresh_gbps": nbytes / median(fresh) / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="one model, one repetition: a smoke test")
    opts = ap.parse_args()
    models = {"cnn": MODELS["cnn"]} if opts.quick else MODELS
    reps = 1 if opts.quick else opts.reps
    tmp = Path(tempfile.mkdtemp(prefix="flor-bench-"))
    results, rows = {}, []
    try:
        for model, margs in models.items():
            # the state copied into reused buffers after the loop, per run: same_process
            times, loops, metas, same_process = interleaved([str(TRAIN), *margs], reps, tmp, model)
            epochs = metas["flor_every"][0]["epochs_done"]
            stalls = [s for m in metas["flor_every"] for s in m["timings"]["stall_s"][1:]]  # first: allocation
            # each run's median stall beside the same process's memcpy of the same tensors
            per_run = [(median(m["timings"]["stall_s"][1:]), g) for m, g in zip(metas["flor_every"], same_process)
                       if len(m["timings"]["stall_s"]) > 1]
            written = median([m["background"]["bytes_written"] for m in metas["flor_every"]]) / epochs
            cpu = median([m["background"]["cpu_s"] for m in metas["flor_every"]]) / epochs
            state_bytes = written  # every tensor changes each epoch: what is written is the state
            probe = memcpy_probe(int(max(state_bytes, 1 << 20)))
            default_ckpts = median([len(m["checkpoint_policy"]["checkpointed_epochs"]) for m in metas["flor"]])
            r = {
                "plain_s": median(times["plain"]), "flor_s": median(times["flor"]), "flor_every_s": median(times["flor_every"]),
                "plain_raised_s": median(times["plain_raised"]),
                **overheads(times, loops),  # the median over rounds of each interleaved pair's ratio
                "default_checkpoints_per_run": default_ckpts, "epochs": epochs,
                "stall_per_checkpoint_s": median(stalls) if stalls else None,
                "stall_gbps": state_bytes / median(stalls) / 1e9 if stalls else None,
                "memcpy_reused_gbps": probe["reused_gbps"], "memcpy_fresh_gbps": probe["fresh_gbps"],
                "memcpy_same_process_gbps": median(same_process),
                # the snapshot's speed (state bytes / median stall) over that run's own memcpy, median over runs
                "snapshot_of_memcpy": median([state_bytes / st / 1e9 / g for st, g in per_run]) if per_run else None,
                "bytes_written_per_epoch": written, "background_cpu_s_per_epoch": cpu,
                "epoch_s": median([s for m in metas["flor_every"] for s in m["timings"]["epoch_s"]]),
                "raw": {"times": times, "loops": loops},
            }
            results[model] = r
            rows.append([model, *(f"{r[k]:+.2%} ({r[k + '_vs_raised']:+.2%})" for k in (
                             "overhead_default", "overhead_every_epoch", "loop_overhead_default",
                             "loop_overhead_every_epoch")),
                         f"{default_ckpts:.0f}/{epochs}",
                         f"{r['stall_per_checkpoint_s'] * 1e3:.2f} ms", f"{r['stall_gbps']:.2f}",
                         f"{r['memcpy_same_process_gbps']:.2f} ({r['snapshot_of_memcpy']:.0%})",
                         f"{probe['reused_gbps']:.2f} / {probe['fresh_gbps']:.2f}",
                         f"{written / 1e6:.1f} MB", f"{cpu:.3f} s ({cpu / r['epoch_s']:.1%})"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(table(rows, ["model", "overhead (default 1% budget)", "overhead (every epoch)", "in-loop (default)",
                       "in-loop (every epoch)",
                       "ckpts at default", "stall/ckpt", "stall GB/s", "same-process memcpy GB/s (snapshot's share)",
                       "memcpy GB/s reused/fresh (separate)",
                       "written/epoch", "background CPU/epoch"]))
    print("overheads against plain (in brackets: against plain with glibc's malloc thresholds raised as flor "
          "raises them, flor.malloc: the checkpoints' own cost)")
    print(f"results: {save('record_overhead', {'reps': reps, 'models': results})}")


if __name__ == "__main__":
    main()
