"""`flor replay` on the example (examples/cnn.py): measured 1- vs 2-worker replay times, and
`flor replay --plan`'s estimate printed just before each, side by side.

Two replays of one recording: the probed script (examples/cnn_probed.py: logging inside the
training block, so every epoch re-executes) and the outer-loop one (examples/cnn_hindsight.py:
every epoch restored). Each with 1 and 2 workers; the estimate is taken right before the run.

    python benchmarks/flor_replay.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import env, run, save, table

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def flor(args: list[str], e: dict[str, str], cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "flor", *args], env=e, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"flor {args} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return wall, proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    opts = ap.parse_args()
    epochs = "4" if opts.quick else "60"  # enough epochs that parallel work outweighs each worker's start-up
    tmp = Path(tempfile.mkdtemp(prefix="flor-bench-"))
    rows, result = [], {"epochs": int(epochs), "runs": []}
    try:
        e = env(tmp / "home", threads=1, FLOR_EVERY="1")
        record_s, _ = run([str(EXAMPLES / "cnn.py"), "--epochs", epochs, "--flor", "cnn"], e, cwd=tmp)
        result["record_s"] = record_s
        for script in ("cnn_probed.py", "cnn_hindsight.py"):
            for workers in ("1", "2"):
                command = ["--", sys.executable, str(EXAMPLES / script), "--epochs", epochs]
                _, plan = flor(["replay", "cnn", "--plan", "--json", "--workers", workers, *command], e, tmp)
                est = json.loads(plan.stdout)
                wall, proc = flor(["replay", "cnn", "--workers", workers, "--fresh", *command], e, tmp)
                assert "flor: replay verified exact" in proc.stderr, proc.stderr[-3000:]
                err = (est["estimate_s"] - wall) / wall
                result["runs"].append({"script": script, "workers": int(workers), "measured_s": wall,
                                       "estimate_s": est["estimate_s"], "error": err, "startup_s": est["startup_s"],
                                       "startup_from": est["startup_from"], "fastest": est["fastest"]})
                rows.append([script, workers, f"{wall:.1f} s", f"{est['estimate_s']:.1f} s", f"{err:+.0%}",
                             f"{est['startup_s']:.1f} s ({est['startup_from']})"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    by = {(r["script"], r["workers"]): r["measured_s"] for r in result["runs"]}
    result["speedup_probed"] = by[("cnn_probed.py", 1)] / by[("cnn_probed.py", 2)]
    result["speedup_outer"] = by[("cnn_hindsight.py", 1)] / by[("cnn_hindsight.py", 2)]
    result["max_abs_error"] = max(abs(r["error"]) for r in result["runs"])
    print(table(rows, ["script", "workers", "measured", "--plan estimate", "error", "startup used"]))
    print(f"2-worker speedup: probed {result['speedup_probed']:.2f}x, outer-loop {result['speedup_outer']:.2f}x; "
          f"largest estimate error {result['max_abs_error']:.0%}")
    print(f"results: {save('flor_replay', result)}")


if __name__ == "__main__":
    main()
