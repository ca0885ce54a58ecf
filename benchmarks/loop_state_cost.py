"""What state kept in the epoch loop costs per checkpoint: the digits CNN of examples/cnn.py, with
what real scripts also pass to ``end()``.

The script is examples/cnn.py with, beside the model, optimizer, scheduler and step, a loss
history that grows every epoch, ``(epoch, val_acc)`` pairs, a NumPy confusion matrix, the
script's own ``np.random.default_rng`` and a plain state object (best accuracy, epochs without
improvement). Until 2026-12-03 each of these kept its block off the fast snapshot: every
checkpoint encoded it in full (and a growing list made a new template each time).

It is recorded with a checkpoint at every epoch (``FLOR_EVERY=1``), with this tree and, with
``--base REV``, with flor at REV (a temporary worktree on PYTHONPATH), interleaved for
``--rounds``; examples/cnn.py as it is, with this tree, for reference. Reported per variant:
the training thread's time per checkpoint (run.json ``timings.stall_s``, median, the first left
out), how many checkpoints took the fast path (``timings.encoded``; before it was recorded: those
with a tensor copy, ``timings.copy_s``),
the writer's GIL time per checkpoint, and what the budget was charged as a share of the
blocks' time (``charged_share``; the exit line's share is of the whole loop, evaluation
included), and the time a block run spends noting the variables it changed outside ``end()``
(``timings.watch_probes_s.VariablesProbe``, before 2026-12-07 ``timings.block_vars_s``; on the
training thread; 0 before 2026-12-06) and what all the probes of the state outside ``end()`` take
(``timings.block_vars_s``: before 2026-12-07 the block variables alone);
then the checkpoints the default 1% budget takes in ``--epochs``.

    python benchmarks/loop_state_cost.py [--epochs 30] [--base REV] [--rounds 3]
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
#: (text in examples/cnn.py, what it becomes): the state a script keeps in its epoch loop
EDITS = {
    "step = 0  # optimizer steps so far": "history, pairs = [], []  # state kept in the loop\n"
                                          "confusion = np.zeros((10, 10), dtype=np.int64)\n"
                                          "mix_rng = np.random.default_rng(args.seed)\n"
                                          "class Tracker:\n    def __init__(self):\n"
                                          "        self.best, self.bad = 0.0, 0\n"
                                          "tracker = Tracker()\n"
                                          "step = 0  # optimizer steps so far",
    "            step += 1\n": "            step += 1\n            history.append(float(mix_rng.random() * 0 + loss.item()))\n",
    "    net, optimizer, scheduler, step = flor.SkipBlock.end(net, optimizer, scheduler, step)  # flor":
        "    confusion[epoch % 10, step % 10] += 1\n"
        "    net, optimizer, scheduler, step, history, pairs, confusion, mix_rng, tracker = flor.SkipBlock.end(\n"
        "        net, optimizer, scheduler, step, history, pairs, confusion, mix_rng, tracker)  # flor",
    "    flor.log(\"val_acc\", val_acc)  # flor": "    flor.log(\"val_acc\", val_acc)  # flor\n"
                                               "    pairs.append((epoch, val_acc))\n"
                                               "    tracker.best, tracker.bad = max(tracker.best, val_acc), "
                                               "tracker.bad + (val_acc < tracker.best)",
}


def state_script(dest: Path) -> Path:
    text = CNN.read_text()
    for old, new in EDITS.items():
        if old not in text:
            raise SystemExit(f"examples/cnn.py changed: {old!r} not found")
        text = text.replace(old, new)
    dest.write_text(text)
    return dest


def figures(meta: dict) -> dict:
    t, policy = meta["timings"], meta["checkpoint_policy"]
    n = max(len(policy["checkpointed_epochs"]), 1)
    training = sum(sum(v) for v in t["blocks"].values())
    encoded = t.get("encoded")  # (a tree before 2026-12-04: only the fast path copied into its own buffers)
    fast = encoded.count("fast") if encoded is not None else sum(c > 0 for c in t["copy_s"])
    runs = sum(len(v) for v in t["blocks"].values())  # block runs: each notes what it changed outside end()
    return {"stall_ms": median(t["stall_s"][1:]) * 1e3, "fast": fast, "of": n,
            "gil_ms": policy["gil_s"] * 1e3 / n, "charged_share": policy["charged_s"] / training,
            # noting the block's variables, globals and own objects' attributes: the old block_vars_s; since
            # 2026-12-07 one probe of flor.watch (VariablesProbe) beside the others, each timed
            "block_vars_ms": t.get("watch_probes_s", {}).get("VariablesProbe", t.get("block_vars_s", 0.0)) * 1e3
            / max(runs, 1),
            # every probe of the state outside end() (before 2026-12-07: the block variables alone were timed)
            "watch_ms": t.get("block_vars_s", 0.0) * 1e3 / max(runs, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--base", help="a git revision measured beside this tree")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="4 epochs, 1 round: a smoke test")
    opts = ap.parse_args()
    epochs, rounds = (4, 1) if opts.quick else (opts.epochs, opts.rounds)
    tmp = Path(tempfile.mkdtemp(prefix="flor-loopstate-"))
    script = state_script(tmp / "cnn_state.py")
    base_tree = worktree(opts.base, tmp / "base") if opts.base else None
    trees = ((("base", base_tree),) if base_tree is not None else ()) + (("this", None),)
    rows: list[dict] = []
    try:
        for i in range(rounds):
            row = {}
            for label, tree in trees:
                extra = {"PYTHONPATH": str(tree)} if tree is not None else {}
                name = f"state-{label}-{i}"
                run([str(script), "--epochs", str(epochs), "--flor", name],
                    env(tmp / name, threads=1, FLOR_EVERY="1", **extra))
                row[label] = figures(run_meta(tmp / name, name))
            name = f"cnn-{i}"
            run([str(CNN), "--epochs", str(epochs), "--flor", name], env(tmp / name, threads=1, FLOR_EVERY="1"))
            row["cnn"] = figures(run_meta(tmp / name, name))
            rows.append(row)
        budget = {}
        for label, tree in trees:
            extra = {"PYTHONPATH": str(tree)} if tree is not None else {}
            name = f"default-{label}"
            run([str(script), "--epochs", str(epochs), "--flor", name], env(tmp / name, threads=1, **extra))
            policy = run_meta(tmp / name, name)["checkpoint_policy"]
            budget[label] = {"checkpointed": len(policy["checkpointed_epochs"]), "of": epochs}
    finally:
        if base_tree is not None:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base_tree)],
                           capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    labels = [label for label, _ in trees] + ["cnn"]
    result = {"quick": opts.quick, "epochs": epochs, "rounds": rows, "base": opts.base, "default_budget": budget,
              "median": {k: {f: median([r[k][f] for r in rows])
                             for f in ("stall_ms", "gil_ms", "charged_share", "block_vars_ms", "watch_ms")}
                         for k in labels}}
    if base_tree is not None:
        result["stall_ratio_by_round"] = [r["this"]["stall_ms"] / r["base"]["stall_ms"] for r in rows]
    names = {"base": f"with loop state, flor {opts.base}", "this": "with loop state, this tree",
             "cnn": "examples/cnn.py as is, this tree"}
    print(table([[names[k], i, f"{r[k]['stall_ms']:.2f}", f"{r[k]['fast']} of {r[k]['of']}", f"{r[k]['gil_ms']:.2f}",
                  f"{r[k]['charged_share']:.2%}", f"{r[k]['block_vars_ms']:.3f}", f"{r[k]['watch_ms']:.3f}"]
                 for i, r in enumerate(rows) for k in labels],
                ["digits CNN", "round", "stall ms (median)", "fast snapshots", "writer GIL ms", "charged / blocks",
                 "block variables ms / block run", "all watch probes ms / block run"]))
    print(table([[names[k], f"{v['checkpointed']} of {v['of']}"] for k, v in budget.items()],
                ["default 1% budget", "epochs checkpointed"]))
    print("wrote", save("loop_state_cost", result))


if __name__ == "__main__":
    main()
