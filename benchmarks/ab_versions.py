"""Two versions of flor side by side: record and replay the same script with each, interleaved.

    python benchmarks/ab_versions.py --base REV [--head REV] [--reps 3] [--model big] [--epochs 4]

Checks out ``--base`` (and ``--head``, else this working tree) into temporary git worktrees and
runs benchmarks/bench_train.py with each tree's flor, alternating (base, head, base, head, ...) so drifts in
machine speed hit both alike: a plain run (no flor), a recording, and an outer-loop replay
with the hindsight log. Prints the medians and head/base ratios and writes
``results/ab_versions.json``. Used to show that a refactor leaves the figures where they were.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

from common import env, median, run, save, table

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def worktree(rev: str, dest: Path) -> Path:
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(dest), rev],
                   check=True, capture_output=True)
    return dest


def one(tree: Path, home: Path, name: str, margs: list[str]) -> dict[str, float]:
    script = str(HERE / "bench_train.py")
    e = env(home, PYTHONPATH=str(tree))
    out: dict[str, float] = {}
    _, which = run(["-c", "import flor; print(flor.__file__)"], e)
    if not which.stdout.strip().startswith(str(tree)):  # the other version must not leak in
        raise SystemExit(f"PYTHONPATH={tree} imports {which.stdout.strip()}")
    out["plain_s"], _ = run([script, *margs], e)
    out["record_s"], _ = run([script, *margs, "--flor", name], e)
    out["replay_s"], _ = run([script, *margs, "--hindsight", "--flor", name, "--replay_flor"], e)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the git revision to compare against")
    ap.add_argument("--head", default=None, help="the revision to measure (default: this working tree)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--model", default="big")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    opts = ap.parse_args()
    margs = ["--model", opts.model, "--epochs", str(opts.epochs), "--steps", str(opts.steps)]
    tmp = Path(tempfile.mkdtemp(prefix="flor-ab-"))
    base = worktree(opts.base, tmp / "base")
    trees = {"base": base, "head": worktree(opts.head, tmp / "head") if opts.head else REPO}
    raw: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
    try:
        for rep in range(opts.reps):
            for label, tree in trees.items():
                home = tmp / f"home-{label}-{rep}"
                raw[label].append(one(tree, home, "ab", margs))
                shutil.rmtree(home, ignore_errors=True)
    finally:
        for tree in trees.values():
            if tree != REPO:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    keys = ["plain_s", "record_s", "replay_s"]
    med = {label: {k: median([r[k] for r in rows]) for k in keys} for label, rows in raw.items()}
    for label in med:
        med[label]["record_overhead"] = med[label]["record_s"] / med[label]["plain_s"] - 1
        med[label]["replay_vs_plain"] = med[label]["replay_s"] / med[label]["plain_s"]
    rows = [[k, f"{med['base'][k]:.3f}", f"{med['head'][k]:.3f}", f"{med['head'][k] / med['base'][k]:.3f}"]
            for k in [*keys, "record_overhead", "replay_vs_plain"] if med["base"][k]]
    print(table(rows, ["median", f"base {opts.base}", f"head {opts.head or ''}", "head/base"]))
    print(f"results: {save('ab_versions', {'base': opts.base, 'head': opts.head or 'working tree', 'args': margs, 'reps': opts.reps, 'median': med, 'raw': raw})}")


if __name__ == "__main__":
    main()
