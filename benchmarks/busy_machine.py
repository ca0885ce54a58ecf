"""Record overhead on a busy machine: every core also runs other work at normal priority.

One busy-loop process per core runs for the whole benchmark (as DataLoader workers, another
job or a neighbour's process would), and the same training script runs without flor and
with ``--flor``, interleaved, so drifts in machine speed hit both alike. The figure is the
median over pairs of end-to-end wall time (process start to exit, the exit flush included),
flor / plain, and flor / plain with glibc's malloc thresholds raised as a flor session raises
them (``plain_raised``, flor.malloc): the checkpoints' own cost. With the background writer
at ``SCHED_IDLE`` (before issue #11) this setup measured +380%: the writer got no CPU,
snapshots queued and the process waited at exit.

    python benchmarks/busy_machine.py [--pairs 3] [--epochs 4] [--every-epoch]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from common import TRAIN, command, env, median, run, run_meta, save_unless_quick, table


def busy_loops(n: int) -> list[subprocess.Popen]:
    """``n`` processes that each keep one core busy, at normal priority."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--every-epoch", action="store_true", help="also record with a checkpoint at every epoch")
    ap.add_argument("--quick", action="store_true", help="a smoke test: one pair")
    opts = ap.parse_args()
    if opts.quick:
        opts.pairs = 1
    cores = os.cpu_count() or 1
    # the 'big' MLP: ~126 MB of weights and AdamW state per checkpoint, 2 torch threads
    args = [str(TRAIN), "--model", "big", "--epochs", str(opts.epochs), "--steps", str(opts.steps), "--batch", "32"]
    tmp = Path(tempfile.mkdtemp(prefix="flor-busy-"))
    # plain_raised: plain after flor.malloc's one malloc and free, the baseline for the checkpoints' cost
    variants: dict[str, dict] = {"plain": {}, "plain_raised": {}, "flor": {}}
    if opts.every_epoch:
        variants["flor_every_epoch"] = {"FLOR_EVERY": "1"}
    times: dict[str, list[float]] = {v: [] for v in variants}
    metas: dict[str, list[dict]] = {v: [] for v in variants if not v.startswith("plain")}
    loops = busy_loops(cores)
    try:
        for pair in range(opts.pairs):
            for variant, extra in variants.items():
                home = tmp / f"{variant}-{pair}"
                wall, _ = run(command(variant, args, "busy"), env(home, **extra))
                times[variant].append(wall)
                if variant in metas:
                    metas[variant].append(run_meta(home, "busy"))
                shutil.rmtree(home, ignore_errors=True)
                print(f"pair {pair} {variant:17s} {wall:7.2f} s", flush=True)
    finally:
        for p in loops:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    result: dict = {"busy_processes": cores, "pairs": opts.pairs, "epochs": opts.epochs, "model": "big (~126 MB/checkpoint)"}
    rows = []
    for variant in variants:
        med = median(times[variant])
        entry = {"wall_s": [round(t, 3) for t in times[variant]], "median_s": round(med, 3)}
        if variant != "plain":
            ratios = [f / p for f, p in zip(times[variant], times["plain"])]
            entry["ratio_median_of_pairs"] = round(median(ratios), 4)
            entry["overhead"] = round(median(ratios) - 1, 4)
        if variant in metas:
            raised = [f / p for f, p in zip(times[variant], times["plain_raised"])]
            entry["ratio_to_plain_raised"] = round(median(raised), 4)
            ms = metas[variant]
            entry["checkpoints_per_run"] = [len(m.get("checkpoint_policy", {}).get("checkpointed_epochs", [])) for m in ms]
            entry["skipped_writer_behind"] = [sum(s["reason"] == "writer behind" for s in m.get("checkpoint_skipped", []))
                                              for m in ms]
            entry["abandoned_at_exit"] = [sum(s["reason"] != "writer behind" for s in m.get("checkpoint_skipped", []))
                                          for m in ms]
        result[variant] = entry
        rows.append([variant, med, entry.get("ratio_median_of_pairs", 1.0), entry.get("ratio_to_plain_raised", "")])
    print(table(rows, ["variant", "median wall s", "/ plain (median of pairs)", "/ plain raised"]))
    save_unless_quick('busy_machine', result, opts.quick)


if __name__ == "__main__":
    main()
