"""Fixed cost per checkpoint for a small model: the digits CNN of examples/cnn.py.

Records examples/cnn.py three ways: with a checkpoint at every epoch (FLOR_EVERY=1, for
``--long-epochs``; the means include the first checkpoint, which pays the full encoding),
reporting the training thread's time per checkpoint (run.json ``timings.stall_s``), the part
of it that copies the tensors' bytes (``timings.copy_s``: a cost per byte, not a fixed one),
the RNG capture each epoch's block starts with (``timings.start_s``), the fixed cost (stall -
copy + start capture, the first checkpoint left out), and the
background writer's CPU and GIL time per checkpoint; and with the default 1% budget, for
``--epochs`` and for ``--long-epochs``, reporting how many epochs it checkpointed and what the
budget was charged with (``checkpoint_policy.charged``).

With ``--base REV`` the every-epoch recording also runs with flor at git revision REV (a
temporary worktree on PYTHONPATH), ``--rounds`` times interleaved with this tree's, and the
fixed costs are reported side by side (median of each round's median, and each round's ratio),
as are the epochs each checkpointed at the default budget (both runs, in every round).

    python benchmarks/checkpoint_fixed_cost.py [--epochs 6] [--long-epochs 30] [--base REV] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

from ab_versions import REPO, worktree
from common import env, median, run, run_meta, save, table

CNN = Path(__file__).resolve().parent.parent / "examples" / "cnn.py"
TARGET_MS = 0.5  # issue #13


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--long-epochs", type=int, default=30, help="a longer run at the default budget")
    ap.add_argument("--quick", action="store_true", help="3 epochs: a smoke test")
    ap.add_argument("--base", help="a git revision whose fixed cost is measured beside this tree's")
    ap.add_argument("--rounds", type=int, default=3, help="with --base: interleaved rounds of each")
    opts = ap.parse_args()
    epochs = 3 if opts.quick else opts.epochs
    tmp = Path(tempfile.mkdtemp(prefix="flor-fixed-"))
    long_epochs = 3 if opts.quick else opts.long_epochs
    base_tree = worktree(opts.base, tmp / "base") if opts.base else None
    rounds: list[dict] = []
    budgets: list[dict] = []  # per round and tree: epochs checkpointed at the default budget
    try:  # every epoch, over the longer run: medians and means over more checkpoints than the first
        for i in range(opts.rounds if base_tree is not None else 1):
            row, counts = {}, {}
            for label, tree in ((("base", base_tree),) if base_tree is not None else ()) + (("this", None),):
                extra = {"PYTHONPATH": str(tree)} if tree is not None else {}
                name = f"every-{label}-{i}"
                run([str(CNN), "--epochs", str(long_epochs), "--flor", name],
                    env(tmp / name, threads=1, FLOR_EVERY="1", **extra))
                row[label] = run_meta(tmp / name, name)
                for n, tag in ((epochs, "default"), (long_epochs, "long")):  # the default 1% budget
                    name = f"{tag}-{label}-{i}"
                    run([str(CNN), "--epochs", str(n), "--flor", name], env(tmp / name, threads=1, **extra))
                    counts[f"{label}_{tag}"] = run_meta(tmp / name, name)
            rounds.append(row)
            budgets.append(counts)
        every = rounds[-1]["this"]
        default, long = budgets[-1]["this_default"], budgets[-1]["this_long"]
    finally:
        if base_tree is not None:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base_tree)], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    stalls = every["timings"]["stall_s"]
    copies = every["timings"]["copy_s"]  # of each stall: the tensor copies
    starts = every["timings"]["start_s"]  # each epoch's RNG capture at step_into
    fixed = [s - c + r for s, c, r in zip(stalls[1:], copies[1:], starts[1:])]
    blocks = every["timings"]["blocks"]["training_loop"]
    policy = default["checkpoint_policy"]
    n_ckpt = len(every["checkpoint_policy"]["checkpointed_epochs"])
    result = {
        "quick": opts.quick, "epochs": epochs, "target_ms": TARGET_MS,
        "stall_ms": [s * 1e3 for s in stalls], "median_stall_ms": median(stalls) * 1e3,
        "median_copy_ms": median(copies[1:]) * 1e3, "median_start_ms": median(starts[1:]) * 1e3,
        "fixed_ms": [f * 1e3 for f in fixed], "median_fixed_ms": median(fixed) * 1e3,
        "median_epoch_s": median(blocks),
        "background_cpu_ms_per_checkpoint": every["background"]["cpu_s"] * 1e3 / max(n_ckpt, 1),
        "background_gil_ms_per_checkpoint": every["checkpoint_policy"]["gil_s"] * 1e3 / max(n_ckpt, 1),
        "gil_waited_ms_per_checkpoint": every["checkpoint_policy"].get("gil_waited_s", 0.0) * 1e3 / max(n_ckpt, 1),
        "default_budget": {"checkpointed_epochs": policy["checkpointed_epochs"], "of": epochs,
                           "charged": policy["charged"], "stall_s": policy["stall_s"],
                           "background_share_s": policy["background_share_s"]},
        "default_budget_long": {"checkpointed_epochs": long["checkpoint_policy"]["checkpointed_epochs"],
                                "of": long_epochs, "charged": long["checkpoint_policy"]["charged"],
                                "charged_s": long["checkpoint_policy"]["charged_s"]},
    }
    if base_tree is not None:
        fixed_by_round = [{label: median(fixed_ms(meta)) for label, meta in row.items()} for row in rounds]
        gil_by_round = [{label: gil_ms(meta) for label, meta in row.items()} for row in rounds]
        result["base"] = {
            "rev": opts.base, "rounds": fixed_by_round, "gil_ms_by_round": gil_by_round,
            "median_fixed_ms": {k: median([r[k] for r in fixed_by_round]) for k in ("base", "this")},
            "ratio_by_round": [r["this"] / r["base"] for r in fixed_by_round],
            "gil_ratio_by_round": [r["this"] / r["base"] for r in gil_by_round],
            "default_budget_by_round": [{k: len(m["checkpoint_policy"]["checkpointed_epochs"]) for k, m in c.items()}
                                        for c in budgets],
        }
        print(table([[i, f"{r['base']:.3f}", f"{r['this']:.3f}", f"{r['this'] / r['base']:.2f}x",
                      f"{g['base']:.2f}", f"{g['this']:.2f}", f"{g['this'] / g['base']:.2f}x"]
                     for i, (r, g) in enumerate(zip(fixed_by_round, gil_by_round))],
                    ["round", f"fixed ms, base {opts.base}", "fixed ms, this tree", "ratio",
                     "writer GIL ms, base", "this tree", "ratio"]))
        print(table([[i, f"{c['base_default']} / {c['this_default']} of {epochs}",
                      f"{c['base_long']} / {c['this_long']} of {long_epochs}"]
                     for i, c in enumerate(result["base"]["default_budget_by_round"])],
                    ["round", f"default budget: base {opts.base} / this tree", "longer run"]))
    print(table([["training-thread time per checkpoint (median)", f"{result['median_stall_ms']:.2f} ms"],
                 ["... of it copying the tensors' bytes", f"{result['median_copy_ms']:.2f} ms"],
                 ["RNG capture at the block's start, per epoch", f"{result['median_start_ms']:.2f} ms"],
                 ["fixed cost: stall - copy + start capture (median)", f"{result['median_fixed_ms']:.2f} ms"],
                 ["target (fixed cost)", f"<= {TARGET_MS} ms"],
                 ["background CPU per checkpoint", f"{result['background_cpu_ms_per_checkpoint']:.2f} ms"],
                 ["of it holding the GIL (not in system calls or hashing)", f"{result['background_gil_ms_per_checkpoint']:.2f} ms"],
                 ["... of which training waited for (charged with a core idle)",
                  f"{result['gil_waited_ms_per_checkpoint']:.2f} ms"],
                 ["epoch (median)", f"{result['median_epoch_s'] * 1e3:.0f} ms"],
                 ["default 1% budget checkpointed", f"{len(policy['checkpointed_epochs'])} of {epochs} epochs"],
                 ["... in a longer run", f"{len(result['default_budget_long']['checkpointed_epochs'])} of {long_epochs}"],
                 ["charged", policy["charged"]]], ["digits CNN", "value"]))
    print("wrote", save("checkpoint_fixed_cost", result))


def fixed_ms(meta: dict) -> list[float]:
    """A recording's fixed cost per checkpoint (stall - copy + the start capture), the first left out, in ms."""
    t = meta["timings"]
    return [(s - c + r) * 1e3 for s, c, r in zip(t["stall_s"][1:], t["copy_s"][1:], t["start_s"][1:])]


def gil_ms(meta: dict) -> float:
    """The writer's GIL time per checkpoint in ms: the mean over a recording's checkpoints (run.json
    keeps the total), the first one's one-time work included."""
    policy = meta["checkpoint_policy"]
    return policy["gil_s"] * 1e3 / max(len(policy["checkpointed_epochs"]), 1)


if __name__ == "__main__":
    main()
