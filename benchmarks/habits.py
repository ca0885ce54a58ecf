"""flor beside what users do instead, in one interleaved run: the record overhead, bytes
stored and peak memory of keeping every epoch's model and optimizer.

Variants, each ``bench_train.py`` with the same seed and data, run in turn every round so
that drifts in machine speed hit all alike:

- ``plain``: no checkpoint at all (the baseline);
- ``torch_save``: ``torch.save`` of model + optimizer state every epoch, one file an epoch
  (nanoGPT's and pytorch/examples' habit; the training loop waits for it);
- ``dcp_async``: ``torch.distributed.checkpoint.async_save`` every epoch, single process, one
  in flight at a time;
- ``flor_every``: ``--flor`` with a checkpoint every epoch (``FLOR_EVERY=1``);
- ``flor``: ``--flor`` at the default budget (1%).

Reported per variant (medians over rounds): wall time and the loop's time as overhead against
plain (ratios of the same round), bytes stored, peak RSS; and for flor, the epochs its default
checkpointed. Results in ``benchmarks/results/habits.json``.

    python benchmarks/habits.py [--model big] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
from pathlib import Path

from common import TRAIN, dir_bytes, env, loop_seconds, median, run, run_meta, save, table

VARIANTS = ("plain", "torch_save", "dcp_async", "flor_every", "flor")
MODELS = {"cnn": ["--model", "cnn", "--epochs", "6", "--steps", "25"],
          "big": ["--model", "big", "--epochs", "6", "--steps", "12", "--batch", "32"]}


def one(variant: str, model_args: list[str], home: Path) -> dict:
    habit_dir = home / "habit"
    args = [str(TRAIN), *model_args]
    extra: dict[str, str] = {}
    if variant in ("torch_save", "dcp_async"):
        args += ["--habit", variant, "--habit-dir", str(habit_dir)]
    elif variant.startswith("flor"):
        args += ["--flor", "habits"]
        if variant == "flor_every":
            extra["FLOR_EVERY"] = "1"
    wall, proc = run(args, env(home, **extra))
    out = {"wall_s": wall, "loop_s": loop_seconds(proc),
           "peak_rss_mb": int(re.search(r"PEAK_RSS_KB (\d+)", proc.stdout).group(1)) / 1024}
    if variant.startswith("flor"):
        out["bytes"] = dir_bytes(home / "habits")
        out["checkpointed"] = len(run_meta(home, "habits")["checkpoint_policy"]["checkpointed_epochs"])
    else:
        out["bytes"] = dir_bytes(habit_dir) if habit_dir.exists() else 0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="big")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="the cnn, 1 round: a smoke test")
    opts = ap.parse_args()
    model, rounds = ("cnn", 1) if opts.quick else (opts.model, opts.rounds)
    tmp = Path(tempfile.mkdtemp(prefix="flor-habits-"))
    rows: list[dict[str, dict]] = []
    try:
        for rnd in range(rounds):
            row = {}
            for variant in VARIANTS:
                home = tmp / f"{variant}-{rnd}"
                row[variant] = one(variant, MODELS[model], home)
                shutil.rmtree(home, ignore_errors=True)
            rows.append(row)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summary = {}
    for v in VARIANTS:
        summary[v] = {
            "overhead": median([r[v]["wall_s"] / r["plain"]["wall_s"] for r in rows]) - 1,
            "loop_overhead": median([r[v]["loop_s"] / r["plain"]["loop_s"] for r in rows]) - 1,
            "mb_stored": median([r[v]["bytes"] for r in rows]) / 1e6,
            "peak_rss_mb": median([r[v]["peak_rss_mb"] for r in rows]),
        }
        if v.startswith("flor"):
            summary[v]["checkpointed"] = median([r[v]["checkpointed"] for r in rows])
    epochs = int(MODELS[model][MODELS[model].index("--epochs") + 1])
    print(table([[v, f"{s['overhead']:+.1%}", f"{s['loop_overhead']:+.1%}", f"{s['mb_stored']:.1f}",
                  f"{s['peak_rss_mb']:.0f}", f"{s['checkpointed']:.0f} of {epochs}" if "checkpointed" in s else
                  (f"{epochs} of {epochs}" if v != "plain" else "-")] for v, s in summary.items()],
                [f"{model}, {rounds} round(s)", "overhead", "in-loop", "MB stored", "peak RSS MB", "epochs kept"]))
    print("wrote", save("habits", {"model": model, "rounds": rows, "summary": summary, "quick": opts.quick}))


if __name__ == "__main__":
    main()
