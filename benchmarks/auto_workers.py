"""``flor replay`` without ``--workers`` against one and two workers, and ``--plan``'s estimate
against the launch it describes, on the benchmarks' scripts (outer-loop and probed replays).

    python benchmarks/auto_workers.py [--rounds 2] [--quick]

Per script: one recording at the default settings; then, per round, in turn: ``flor replay NAME
-- python SCRIPT --hindsight`` with no ``--workers`` (the launcher picks the count), with
``--workers 1`` and with ``--workers 2``, each preceded by ``flor replay --plan --json`` with the
same arguments (its ``estimate_s``). Reported: each launch's wall time (the ``flor replay``
process, start to exit), auto over one worker (at most 1.0 is the target) and each estimate over
the time it estimated (within 25% is the target). Results: results/auto_workers.json.
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

from common import HERE, TRAIN, env, median, run, save_unless_quick, table

SCRIPTS = {  # name: (script, arguments, probed?)
    "cnn outer-loop": (HERE / "small_train.py", ["--model", "cnn"], False),
    "vae outer-loop": (HERE / "small_train.py", ["--model", "vae"], False),
    "tsp outer-loop": (HERE / "small_train.py", ["--model", "tsp"], False),
    "conv probed": (TRAIN, ["--model", "cnn", "--epochs", "6", "--steps", "30"], True),
}
FLOR = [sys.executable, "-m", "flor"]


def launch(name: str, script: Path, args: list[str], extra: list[str], e: dict) -> tuple[float, float, int]:
    """``--plan``'s estimate, the launch's wall time, and the workers it ran."""
    cmd = ["--", sys.executable, str(script), *args]
    plan = subprocess.run([*FLOR, "replay", name, "--plan", "--json", *extra, *cmd], env=e, capture_output=True,
                          text=True, check=True)
    est = json.loads(plan.stdout)
    t0 = time.perf_counter()
    proc = subprocess.run([*FLOR, "replay", name, "--fresh", *extra, *cmd], env=e, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or "verified exact" not in proc.stderr.splitlines()[-1]:
        raise RuntimeError(f"flor replay {name} {extra} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return est["estimate_s"], wall, int(est["workers"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="one round, one script: a smoke test, not saved")
    opts = ap.parse_args()
    scripts = dict(list(SCRIPTS.items())[:1]) if opts.quick else SCRIPTS
    rounds = 1 if opts.quick else opts.rounds
    tmp = Path(tempfile.mkdtemp(prefix="flor-auto-"))
    result: dict = {"rounds": rounds}
    rows = []
    try:
        for label, (script, args, probed) in scripts.items():
            name = label.split()[0]
            e = env(tmp / "home", threads=1 if name == "cnn" else 2)
            hind = [*args, "--hindsight", *(["--probe"] if probed else [])]
            run([str(script), *args, "--flor", name], e)
            walls: dict[str, list[float]] = {"auto": [], "1": [], "2": []}
            ests: dict[str, list[float]] = {k: [] for k in walls}
            picked: list[int] = []
            for _ in range(rounds):
                for key, extra in (("auto", []), ("1", ["--workers", "1"]), ("2", ["--workers", "2"])):
                    est, wall, n = launch(name, script, hind, extra, e)
                    walls[key].append(wall)
                    ests[key].append(est)
                    if key == "auto":
                        picked.append(n)
            entry = {
                "auto_workers": picked, "wall_s": walls, "estimate_s": ests,
                "auto_over_one": round(median([a / o for a, o in zip(walls["auto"], walls["1"])]), 3),
                "two_over_one": round(median([t / o for t, o in zip(walls["2"], walls["1"])]), 3),
                "estimate_over_actual": {k: round(median([x / w for x, w in zip(ests[k], walls[k])]), 3)
                                         for k in walls},
            }
            result[label] = entry
            rows.append([label, ",".join(map(str, picked)), f"{entry['auto_over_one']:.2f}",
                         f"{entry['two_over_one']:.2f}",
                         " ".join(f"{k}:{v:.2f}" for k, v in entry["estimate_over_actual"].items())])
            print(f"{label}: {entry}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(table(rows, ["replay", "auto picked", "auto / 1 worker", "2 / 1 worker", "--plan / actual"]))
    save_unless_quick("auto_workers", result, opts.quick)


if __name__ == "__main__":
    main()
