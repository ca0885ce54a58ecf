"""Run every benchmark, one after another: python benchmarks/run_all.py [--quick]."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = ["log_call", "storage", "record_overhead", "replay_speedup", "parallel_replay", "flor_replay",
              "reliability", "busy_machine", "writer_floor", "checkpoint_fixed_cost", "loop_state_cost", "vs_flor",
              "small_models", "habits", "auto_workers", "overhead_parts", "iteration_loop", "frameworks"]

if __name__ == "__main__":
    import torch

    failed = []
    # the GPU path needs a GPU (benchmarks/gpu.py); elsewhere it is left out, and said so
    names = BENCHMARKS + ["gpu"] if torch.cuda.is_available() else BENCHMARKS
    if "gpu" not in names:
        print("(gpu: no CUDA device here, left out)", flush=True)
    for name in names:
        print(f"\n== {name} ==", flush=True)
        if subprocess.run([sys.executable, str(HERE / f"{name}.py"), *sys.argv[1:]]).returncode != 0:
            failed.append(name)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")
