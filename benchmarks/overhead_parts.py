"""Where a recording's every-epoch overhead goes: one recording's extra wall time split into
parts that add up to it, beside the plain script, interleaved.

    python benchmarks/overhead_parts.py [--rounds 3] [--epochs 6] [--quick]

The big MLP of bench_train.py (~126 MB of parameters and AdamW state a checkpoint, 2 torch
threads on 2 cores), run in turn as plain with glibc's thresholds raised as a flor session raises
them (``plain_raised``: the allocator in the same state) and as ``--flor`` with a checkpoint every
epoch. For each pair, flor's extra wall time is split into:

- ``outside the loop``: import, session start, the exit flush (wall minus LOOP_SECONDS, against
  plain's);
- in the loop, from the recording's run.json: ``stall`` (the training thread copying the state
  into reused buffers), ``probes`` (the state outside ``end()``, loop variables), ``GIL waits``
  (training waiting for the writer's Python work), and ``writer CPU`` (the background thread's
  CPU time: on cores training fills, taken from training);
- ``rest``: what the parts above leave of the measured in-loop difference (memory bandwidth
  and caches shared with the writer, page cache, scheduling).

Also each process's CPU time (user + system, rusage) against plain's. Results: results/overhead_parts.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import RAISED, TRAIN, env, save_unless_quick, table


def run_cpu(cmd: list[str], e: dict) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user + system, the child's own rusage) and LOOP_SECONDS of one run."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *cmd], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = proc.stdout.read().decode()
    err = proc.stderr.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{cmd} failed:\n{err[-3000:]}")
    return wall, usage.ru_utime + usage.ru_stime, float(re.search(r"LOOP_SECONDS ([\d.]+)", out).group(1))


def parts(meta: dict) -> dict[str, float]:
    t = meta["timings"]
    pol = meta["checkpoint_policy"]
    return {"stall": sum(t.get("stall_s", [])), "probes": pol.get("watch_s", 0.0),
            "GIL waits": sum(t.get("gil_waited_s", [])), "writer CPU": meta["background"]["cpu_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--quick", action="store_true", help="one round of 2 epochs: a smoke test, not saved")
    opts = ap.parse_args()
    rounds, epochs = (1, 2) if opts.quick else (opts.rounds, opts.epochs)
    args = [str(TRAIN), "--model", "big", "--epochs", str(epochs), "--steps", "12", "--batch", "32"]
    tmp = Path(tempfile.mkdtemp(prefix="flor-parts-"))
    pairs = []
    try:
        for rnd in range(rounds):
            home = tmp / f"home{rnd}"
            p_wall, p_cpu, p_loop = run_cpu(["-c", RAISED, *args], env(tmp / "unused"))
            f_wall, f_cpu, f_loop = run_cpu([*args, "--flor", "parts"], env(home, FLOR_EVERY="1"))
            meta = json.loads(max((home / "parts" / "runs").glob("*/run.json")).read_text())
            shutil.rmtree(home, ignore_errors=True)
            split = {"outside the loop": (f_wall - f_loop) - (p_wall - p_loop), **parts(meta)}
            split["rest"] = (f_loop - p_loop) - sum(v for k, v in split.items() if k != "outside the loop")
            pairs.append({"plain_raised": {"wall_s": p_wall, "cpu_s": p_cpu, "loop_s": p_loop},
                          "flor_every": {"wall_s": f_wall, "cpu_s": f_cpu, "loop_s": f_loop},
                          "extra_wall_s": f_wall - p_wall, "parts_s": split,
                          "checkpoints": len(meta["checkpoint_policy"]["checkpointed_epochs"])})
            print(f"round {rnd}: plain_raised {p_wall:.2f} s, flor every epoch {f_wall:.2f} s; "
                  + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in split.items()), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    mid = sorted(pairs, key=lambda p: p["extra_wall_s"] / p["plain_raised"]["wall_s"])[len(pairs) // 2]
    base = mid["plain_raised"]["wall_s"]
    result = {
        "rounds": rounds, "epochs": epochs, "model": "big MLP (~126 MB a checkpoint), 2 torch threads",
        "overhead_vs_raised": round(mid["extra_wall_s"] / base, 4),
        "overhead_vs_raised_rounds": [round(p["extra_wall_s"] / p["plain_raised"]["wall_s"], 4) for p in pairs],
        "median_round": mid, "rounds_detail": pairs,
        "parts_share_of_plain": {k: round(v / base, 4) for k, v in mid["parts_s"].items()},
        "cpu_extra_s": mid["flor_every"]["cpu_s"] - mid["plain_raised"]["cpu_s"],
    }
    rows = [[k, f"{v * 1e3:.0f} ms", f"{v / base:+.2%}"] for k, v in mid["parts_s"].items()]
    rows.append(["total (measured)", f"{mid['extra_wall_s'] * 1e3:.0f} ms", f"{mid['extra_wall_s'] / base:+.2%}"])
    print(table(rows, ["part (the median round)", "seconds", "of plain's wall"]))
    save_unless_quick("overhead_parts", result, opts.quick)


if __name__ == "__main__":
    main()
