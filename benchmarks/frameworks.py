"""FlorCallback on real trainers: record overhead against the same Trainer without the callback,
and the replay of a hindsight metric against the full run of the edited script.

    python benchmarks/frameworks.py [--rounds 3]

Runs tests/scripts/lightning_fit.py (PyTorch Lightning) and tests/scripts/hf_trainer.py (Hugging
Face Trainer) with models made large enough that training dominates, interleaved (plain, record,
full run of the edited script, replay) so drifts in machine speed hit every variant alike. Times
are of the fit alone (``FIT_SECONDS``, printed by the scripts: imports are not flor's cost).
Writes ``results/frameworks.json``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
from pathlib import Path

from common import env, median, run, save, table

SCRIPTS = Path(__file__).resolve().parents[1] / "tests" / "scripts"
FRAMEWORKS = {
    "lightning": ("lightning_fit.py", {"EPOCHS": "4", "WIDTH": "1024", "SAMPLES": "8192"},
                  ("        # VALIDATION", '        self.log("val_acc", (logits.argmax(1) == y).float().mean())')),
    "transformers": ("hf_trainer.py", {"EPOCHS": "4", "WIDTH": "128", "SAMPLES": "2048", "HF_HUB_OFFLINE": "1"},
                     ("    # METRICS", '    metrics["max_logit"] = float(logits.max())')),
}


def fit_seconds(proc) -> float:
    return float(re.search(r"FIT_SECONDS ([\d.]+)", proc.stderr).group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    opts = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="flor-frameworks-"))
    result: dict = {}
    rows = []
    try:
        for name, (script, extra, (mark, metric)) in FRAMEWORKS.items():
            text = (SCRIPTS / script).read_text()
            plain = tmp / f"bench_{name}_plain.py"  # the same Trainer without FlorCallback
            plain.write_text(re.sub(r"FlorCallback\(\),? ?", "", text))
            recorded = tmp / f"bench_{name}.py"  # not transformers.py: it would shadow the package
            recorded.write_text(text)
            edited = tmp / f"bench_{name}_hindsight.py"
            edited.write_text(text.replace(mark, metric))
            times: dict[str, list[float]] = {k: [] for k in ("plain", "record", "record_every", "full", "replay")}
            for r in range(opts.rounds):
                home = tmp / f"home-{name}-{r}"
                e = env(home, **extra)
                times["plain"].append(fit_seconds(run([str(plain)], e, cwd=tmp)[1]))
                times["record"].append(fit_seconds(run([str(recorded), "--flor", "r"], e, cwd=tmp)[1]))
                every = env(home, FLOR_EVERY="1", **extra)
                times["record_every"].append(fit_seconds(run([str(recorded), "--flor", "e"], every, cwd=tmp)[1]))
                times["full"].append(fit_seconds(run([str(edited)], e, cwd=tmp)[1]))
                _, proc = run([str(edited), "--flor", "e", "--replay_flor"], e, cwd=tmp)
                assert "replay verified exact" in proc.stderr, proc.stderr[-2000:]
                times["replay"].append(fit_seconds(proc))
            med = {k: median(v) for k, v in times.items()}
            result[name] = {"settings": extra, "fit_s": times, "median_s": med,
                            "record_overhead": med["record"] / med["plain"] - 1,
                            "record_every_epoch_overhead": med["record_every"] / med["plain"] - 1,
                            "replay_speedup": med["full"] / med["replay"]}
            rows.append([name, med["plain"], result[name]["record_overhead"] * 100,
                         result[name]["record_every_epoch_overhead"] * 100, result[name]["replay_speedup"]])
            save("frameworks", {"rounds": opts.rounds, **result})  # each trainer's figures as they come
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(table(rows, ["trainer", "fit s (no flor)", "record overhead %", "every epoch %", "replay speedup x"]))
    print(save("frameworks", {"rounds": opts.rounds, **result}))


if __name__ == "__main__":
    main()
