"""Small real models at the default budget: are they checkpointed at every epoch, and how fast
is the outer-loop replay against a plain full run of the edited script? Quiet, and with every
core busy (one busy-loop process per core at normal priority, as another job would).

    python benchmarks/small_models.py [--rounds 2] [--epochs 6] [--loads quiet,busy] [--threads 2] [--quick]

Each load's figures replace that load's in the results file (the others are kept), so the loads
can run apart: ``--loads busy --threads 1`` (with two torch threads against a busy loop per core,
OpenMP's spinning makes one script's runs vary 2.5x: the same plain vae took 95 and 236 s).

Scripts: benchmarks/small_train.py (the digits CNN, pytorch/examples' vae and
time_sequence_prediction shapes). Per round and load, for each model in turn: a plain run of
the script; a recording at the default settings (``--flor NAME``, no budget flag); a plain run
of the edited script (``--hindsight``: an outer-loop log of the weights' norm), what a user
without flor would run; a replay of the edited script (``--replay_flor``). Reported: the epochs
the default kept, which of them past the budget for the replay they save (run.json
``checkpoint_policy.replay_epochs``), the recording's wall against plain, and the replay's wall
against the edited script's full run (whole processes, start-up included; the median of each
round's ratios). Results: results/small_models.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from busy_machine import busy_loops
from common import HERE, RESULTS, env, median, run, run_meta, save_unless_quick, table

SCRIPT = HERE / "small_train.py"
MODELS = ("cnn", "vae", "tsp")


def one_round(model: str, epochs: int, tmp: Path, threads: int) -> dict:
    home = tmp / model
    args = [str(SCRIPT), "--model", model, "--epochs", str(epochs)]
    plain_s, _ = run(args, env(tmp / "unused", threads))
    record_s, proc = run([*args, "--flor", model], env(home, threads))
    full_s, _ = run([*args, "--hindsight"], env(tmp / "unused", threads))
    replay_s, replayed = run([*args, "--hindsight", "--flor", model, "--replay_flor"], env(home, threads))
    assert "replay verified exact" in replayed.stderr, replayed.stderr[-2000:]
    policy = run_meta(home, model)["checkpoint_policy"]
    shutil.rmtree(home, ignore_errors=True)
    return {"plain_s": plain_s, "record_s": record_s, "full_edited_s": full_s, "replay_s": replay_s,
            "kept": len(policy["checkpointed_epochs"]), "replay_epochs": len(policy.get("replay_epochs", [])),
            "charged_share": policy["charged_s"] / max(record_s - policy["charged_s"], 1e-9)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--loads", default="quiet,busy")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--threads", type=int, default=2, help="torch threads a process (the cnn script sets 1 itself)")
    ap.add_argument("--quick", action="store_true", help="a smoke test: one round, 2 epochs, not saved")
    opts = ap.parse_args()
    if opts.quick:
        opts.rounds, opts.epochs = 1, 2
    models = opts.models.split(",")
    old = RESULTS / "small_models.json"
    result: dict = json.loads(old.read_text()) if old.exists() and not opts.quick else {}
    for key in ("benchmark", "date", "machine"):
        result.pop(key, None)
    result["script"] = "benchmarks/small_train.py"
    rows = []
    for load in opts.loads.split(","):
        loops = busy_loops(os.cpu_count() or 1) if load == "busy" else []
        tmp = Path(tempfile.mkdtemp(prefix="flor-small-"))
        try:
            rounds: dict[str, list[dict]] = {m: [] for m in models}
            for rnd in range(opts.rounds):
                for model in models:  # interleaved: drifts in machine speed hit every model alike
                    r = one_round(model, opts.epochs, tmp, opts.threads)
                    rounds[model].append(r)
                    print(f"{load} round {rnd} {model}: kept {r['kept']}/{opts.epochs}, record {r['record_s']:.1f} s "
                          f"/ plain {r['plain_s']:.1f} s, replay {r['replay_s']:.1f} s / full {r['full_edited_s']:.1f} s",
                          file=sys.stderr, flush=True)
        finally:
            for p in loops:
                p.kill()
                p.wait()
            shutil.rmtree(tmp, ignore_errors=True)
        for model in models:
            rs = rounds[model]
            entry = {
                "kept": [r["kept"] for r in rs], "kept_for_replay": [r["replay_epochs"] for r in rs],
                "record_overhead": round(median([r["record_s"] / r["plain_s"] for r in rs]) - 1, 4),
                "replay_over_full_run": round(median([r["replay_s"] / r["full_edited_s"] for r in rs]), 4),
                "charged_share": round(median([r["charged_share"] for r in rs]), 5),
                "rounds": [{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for r in rs],
            }
            result[f"{load}/{model}"] = entry
            entry.update(epochs=opts.epochs, threads=opts.threads, when=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
            rows.append([load, model, f"{min(entry['kept'])}-{max(entry['kept'])} of {opts.epochs}",
                         f"{entry['record_overhead']:+.1%}", f"{entry['replay_over_full_run']:.2f}"])
    print(table(rows, ["load", "model", "kept at default", "record vs plain", "replay / full run"]))
    save_unless_quick('small_models', result, opts.quick)


if __name__ == "__main__":
    main()
