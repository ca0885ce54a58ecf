"""FlorCallback on real trainers: record overhead against the same Trainer without the callback,
and the replay of a hindsight metric against the full run of the edited script.

    python benchmarks/frameworks.py [--rounds 3]

Runs tests/scripts/lightning_fit.py (PyTorch Lightning) and tests/scripts/hf_trainer.py (Hugging
Face Trainer) with models made large enough that training dominates, interleaved (plain, record,
full run of the edited script, replay) so drifts in machine speed hit every variant alike; each
ratio is the median over rounds of that round's own ratio. Times are of the fit alone
(``FIT_SECONDS``, printed by the scripts: imports are not flor's cost). Writes
``results/frameworks.json``; ``--small`` runs the scripts at the tests' sizes, to check the
benchmark end to end in a minute, and writes nothing.
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
    ap.add_argument("--small", action="store_true", help="the tests' sizes, one round, no results file")
    opts = ap.parse_args()
    if opts.small:
        opts.rounds = 1
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
                sizes = {k: v for k, v in extra.items() if not opts.small or k == "HF_HUB_OFFLINE"}
                e = env(home, **sizes)
                times["plain"].append(fit_seconds(run([str(plain)], e, cwd=tmp)[1]))
                times["record"].append(fit_seconds(run([str(recorded), "--flor", "r"], e, cwd=tmp)[1]))
                every = env(home, FLOR_EVERY="1", **sizes)
                times["record_every"].append(fit_seconds(run([str(recorded), "--flor", "e"], every, cwd=tmp)[1]))
                times["full"].append(fit_seconds(run([str(edited)], e, cwd=tmp)[1]))
                _, proc = run([str(edited), "--flor", "e", "--replay_flor"], e, cwd=tmp)
                assert "replay verified exact" in proc.stderr, proc.stderr[-2000:]
                times["replay"].append(fit_seconds(proc))
            med = {k: median(v) for k, v in times.items()}

            def paired(a: str, b: str) -> float:
                """The median over rounds of each round's own a/b: runs side by side share the machine's state."""
                return median([x / y for x, y in zip(times[a], times[b])])

            result[name] = {"settings": extra, "fit_s": times, "median_s": med,
                            "record_overhead": paired("record", "plain") - 1,
                            "record_every_epoch_overhead": paired("record_every", "plain") - 1,
                            "replay_speedup": paired("full", "replay")}
            rows.append([name, med["plain"], result[name]["record_overhead"] * 100,
                         result[name]["record_every_epoch_overhead"] * 100, result[name]["replay_speedup"]])
            if not opts.small:
                save("frameworks", {"rounds": opts.rounds, **result})  # each trainer's figures as they come
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(table(rows, ["trainer", "fit s (no flor)", "record overhead %", "every epoch %", "replay speedup x"]))
    if not opts.small:
        print(save("frameworks", {"rounds": opts.rounds, **result}))


if __name__ == "__main__":
    main()
