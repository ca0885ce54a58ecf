"""Parallel replay: a probed replay (every epoch re-executed) with 1 and with 2 workers of one
thread each, beside a same-run probe of how two independent single-threaded processes scale
on this machine (the ceiling), and a model of 4-64 workers from the measured costs.

    python benchmarks/parallel_replay.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import TRAIN, env, latest_run, run, run_meta, save, table

PROBE = r"""
import time, torch
torch.set_num_threads(1)
a = torch.randn(256, 256)
t0 = time.perf_counter()
for _ in range(N):
    a = torch.tanh(a @ a * 0.01)
print(time.perf_counter() - t0)
"""


LOOPS: list[float] = []  # LOOP_SECONDS printed by the workers of the last concurrent() call


def concurrent(cmds: list[list[str]], envs: list[dict]) -> float:
    """Wall time until the last of several processes started together finishes."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, *c], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c, e in zip(cmds, envs)]
    LOOPS.clear()
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"worker failed: {err[-3000:]}")
        if "LOOP_SECONDS" in out:
            LOOPS.append(float(out.split("LOOP_SECONDS")[1].split()[0]))
    return time.perf_counter() - t0


def scaling_probe(tmp: Path, n: int) -> float:
    script = tmp / "probe.py"
    script.write_text(PROBE.replace("N", str(n)))
    e = env(tmp / "unused", threads=1)
    one = concurrent([[str(script)]], [e])
    two = concurrent([[str(script)], [str(script)]], [e, e])
    return 2 * one / two


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    opts = ap.parse_args()
    epochs = 4 if opts.quick else 10
    margs = ["--model", "cnn", "--epochs", str(epochs), "--steps", "6" if opts.quick else "60"]
    tmp = Path(tempfile.mkdtemp(prefix="flor-bench-"))
    try:
        home = tmp / "home"
        e = env(home, threads=1, FLOR_EVERY="1")
        run([str(TRAIN), *margs, "--flor", "bench"], e)
        meta = run_meta(home, "bench")
        replay = [str(TRAIN), *margs, "--probe", "--flor", "bench", "--replay_flor"]
        one = concurrent([replay + ["0/1"]], [env(home, threads=1, FLOR_REPLAY_ID="one")])
        one_loops = list(LOOPS)
        one_loop = max(LOOPS)
        two = concurrent([replay + ["0/2"], replay + ["1/2"]],
                         [env(home, threads=1, FLOR_REPLAY_ID="two"), env(home, threads=1, FLOR_REPLAY_ID="two")])
        two_loops = list(LOOPS)
        two_loop = max(LOOPS)
        ceiling = scaling_probe(tmp, 300 if opts.quick else 1500)
        startup_s, _ = run(["-c", "import torch, flor"], env(tmp / "unused", threads=1))
        summaries = [json.loads(p.read_text()) for p in (latest_run(home, "bench") / "logs").glob("replay-two-*.summary.json")]
        assert all(s["verdict"] == "verified exact" for s in summaries), summaries
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    speedup = one / two
    epoch_s = (one - startup_s) / epochs  # a probed epoch: the block re-executed, plus the outer loop
    init_s = sum(meta["timings"]["epoch_s"]) / epochs - sum(meta["timings"]["blocks"]["train"]) / epochs
    model_epochs = 200
    model = {}
    for n in (1, 4, 8, 16, 32, 64):
        t = startup_s + (init_s if n > 1 else 0) + math.ceil(model_epochs / n) * epoch_s
        model[n] = (startup_s + model_epochs * epoch_s) / t
    loop_speedup = one_loop / two_loop
    result = {"epochs": epochs, "one_worker_s": one, "two_workers_s": two, "speedup": speedup,
              "loop_speedup": loop_speedup, "loop_s": {"one": one_loops, "two": two_loops}, "loop_fraction_of_ceiling": loop_speedup / ceiling,
              "ceiling": ceiling, "fraction_of_ceiling": speedup / ceiling, "startup_s": startup_s,
              "probed_epoch_s": epoch_s, "init_s": init_s,
              "model": {"epochs": model_epochs, "speedup_by_workers": model,
                        "formula": "startup + init + ceil(E/N) * probed_epoch  (vs startup + E * probed_epoch)"}}
    print(table([[f"{one:.2f} s", f"{two:.2f} s", f"{speedup:.2f}x", f"{speedup / ceiling:.0%}",
                  f"{loop_speedup:.2f}x", f"{loop_speedup / ceiling:.0%}", f"{ceiling:.2f}x"]],
                ["1 worker", "2 workers", "speedup end-to-end", "of ceiling", "speedup in loop", "of ceiling",
                 "2-process ceiling here"]))
    print(f"model for a {model_epochs}-epoch probed replay (assumes a core or GPU per worker):")
    print(table([[n, f"{s:.1f}x"] for n, s in model.items()], ["workers", "speedup"]))
    print(f"results: {save('parallel_replay', result)}")


if __name__ == "__main__":
    main()
