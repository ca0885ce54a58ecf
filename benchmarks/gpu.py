"""The GPU path on a GPU: record overhead, checkpoints at the default budget and the charge
the policy chose, the training thread's stall per checkpoint beside the same process's copy of
the same state into pinned buffers, the writer's CPU per GB, and replay: outer-loop and probed
hindsight values against a full re-execution of the edited script (bit for bit), replay time
against re-training.

Needs a CUDA device (``--device cpu`` runs the same steps on the CPU: a smoke test of this
script). Runs are interleaved (plain, flor at the default budget, flor checkpointing every
epoch), so that drifts in machine speed hit all variants alike.

    python benchmarks/gpu.py [--rounds 3] [--quick] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from common import TRAIN, env, interleaved, median, overheads, run, save, table

# GPU epochs of a tenth to a third of a second: longer than the CPU benchmarks' (the same
# model trains ~50x faster), short enough that the whole benchmark takes a few minutes
MODELS = {"cnn": ["--model", "cnn", "--epochs", "8", "--steps", "100", "--batch", "128"],
          "big": ["--model", "big", "--epochs", "6", "--steps", "60", "--batch", "2048"]}
QUICK = {"cnn": ["--model", "cnn", "--epochs", "3", "--steps", "5"],
         "big": ["--model", "big", "--epochs", "3", "--steps", "3", "--batch", "32"]}


def logged(home: Path, name: str, source: str) -> dict:
    """{(name, epoch, step): value} of the newest recording's (or replay's) log."""
    out = run(["-m", "flor", "logs", name], env(home))[1].stdout
    records = [json.loads(line) for line in out.splitlines() if line.strip()]
    if source == "replay":
        newest = max(r["replay"] for r in records if r["source"] == "replay")
        records = [r for r in records if r["source"] == "replay" and r["replay"] == newest]
    else:
        records = [r for r in records if r["source"] == source]
    return {(r["name"], r["epoch"], r["step"]): r["value"] for r in records}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="small sizes, one round: a smoke test")
    ap.add_argument("--device", default="cuda")
    opts = ap.parse_args()
    import torch

    if opts.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("no CUDA device: this benchmark measures the GPU path (--device cpu runs it as a smoke test)")
    models = QUICK if opts.quick else MODELS
    rounds = 1 if opts.quick else opts.rounds
    dev = ["--device", opts.device]
    # cuBLAS picks the same kernels in every process only with a fixed workspace (probed replay)
    gpu_env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    tmp = Path(tempfile.mkdtemp(prefix="flor-gpu-"))
    results: dict = {}
    rows, replay_rows = [], []
    try:
        for model, margs in models.items():
            args = [str(TRAIN), *margs, *dev]
            # probe: each every-epoch run's own copy of its state into pinned buffers, waited for
            times, loops, metas, probe = interleaved(args, rounds, tmp, model, keep_last=True, **gpu_env)
            every = metas["flor_every"]
            epochs = every[0]["epochs_done"]
            stalls = [s for m in every for s in m["timings"]["stall_s"][1:]]  # the first learns the block
            first = [m["timings"]["stall_s"][0] for m in every]
            state = median([m["background"]["bytes_written"] for m in every]) / epochs
            cpu_gb = median([m["background"]["cpu_s"] / max(m["background"]["bytes_written"], 1) * 1e9 for m in every])
            copy_s = state / (median(probe) * 1e9)  # the same bytes, device to pinned host memory, waited for
            r = {
                "plain_s": median(times["plain"]), "flor_s": median(times["flor"]), "flor_every_s": median(times["flor_every"]),
                "plain_raised_s": median(times["plain_raised"]),
                **overheads(times, loops),  # the median over rounds of each interleaved pair's ratio
                "epochs": epochs, "epoch_s": median([s for m in every for s in m["timings"]["epoch_s"]]),
                "default_checkpoints": [len(m["checkpoint_policy"]["checkpointed_epochs"]) for m in metas["flor"]],
                "charged": sorted({m["checkpoint_policy"]["charged"] for m in metas["flor"]}),
                "encoded": every[0]["timings"].get("encoded"),
                "stall_first_s": median(first), "stall_per_checkpoint_s": median(stalls) if stalls else None,
                "state_bytes": state, "pinned_copy_gbps": median(probe), "pinned_copy_s": copy_s,
                "background_cpu_s_per_gb": cpu_gb,
                "raw": {"times": times, "loops": loops},
            }
            results[model] = r
            rows.append([model, f"{r['epoch_s'] * 1e3:.0f} ms", f"{r['overhead_default']:+.2%}",
                         f"{r['overhead_every_epoch']:+.2%}", f"{r['loop_overhead_default']:+.2%}",
                         f"{r['loop_overhead_every_epoch']:+.2%}",
                         " / ".join(str(n) for n in r["default_checkpoints"]) + f" of {epochs}",
                         f"{r['stall_first_s'] * 1e3:.2f} ms", f"{(r['stall_per_checkpoint_s'] or 0) * 1e3:.2f} ms",
                         f"{state / 1e6:.1f} MB in {copy_s * 1e3:.2f} ms ({r['pinned_copy_gbps']:.1f} GB/s)",
                         f"{cpu_gb:.2f}", ",".join(r["encoded"] or [])[:40]])

            # replay: the last every-epoch recording, edited (--hindsight: an outer-loop log;
            # --probe: the loss inside the block), against the edited script run in full
            home = tmp / f"{model}-flor_every-{rounds - 1}"
            e = env(home, **gpu_env, FLOR_EVERY="1")
            full_home = tmp / f"{model}-full"
            retrain_s, _ = run([*args, "--hindsight", "--probe", "--flor", "full"], env(full_home, **gpu_env, FLOR_EVERY="1"))
            full = logged(full_home, "full", "record")
            outer_s, outer = run([*args, "--hindsight", "--flor", "bench", "--replay_flor"], e)
            got_outer = logged(home, "bench", "replay")
            probed_s, probed = run([*args, "--hindsight", "--probe", "--flor", "bench", "--replay_flor"], e)
            got_probed = logged(home, "bench", "replay")  # the newest replay's
            outer_keys = {k for k in full if k[0] != "loss"}  # the outer loop's: val_loss, weight_norm
            rep = {
                "retrain_s": retrain_s, "outer_replay_s": outer_s, "probed_replay_s": probed_s,
                "outer_exact": "replay verified exact" in outer.stderr,
                "probed_exact": "replay verified exact" in probed.stderr,
                "outer_values_equal": bool(outer_keys) and got_outer == {k: full[k] for k in outer_keys},
                "probed_values_equal": got_probed == full,
                "logged_values": len(full),
            }
            results[model]["replay"] = rep
            replay_rows.append([model, f"{retrain_s:.2f} s", f"{outer_s:.2f} s ({retrain_s / outer_s:.2f}x)",
                                f"{probed_s:.2f} s", str(rep["outer_exact"] and rep["outer_values_equal"]),
                                f"{rep['probed_exact'] and rep['probed_values_equal']} ({len(full)} values)"])
            shutil.rmtree(home, ignore_errors=True)
            shutil.rmtree(full_home, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(table(rows, ["model", "epoch", "overhead (default)", "overhead (every epoch)", "in-loop (default)",
                       "in-loop (every)", "ckpts at default", "first stall", "stall/ckpt",
                       "state, copied to pinned memory (same process)", "writer CPU-s/GB", "encoded"]))
    print()
    print(table(replay_rows, ["model", "re-train (the edited script, recorded to read its values)", "outer-loop replay",
                              "probed replay", "outer exact", "probed exact"]))
    if opts.quick:
        return
    print(f"results: {save('gpu', {'rounds': rounds, 'device': opts.device, 'models': results})}")
    bad = [m for m, r in results.items() if not (r["replay"]["outer_values_equal"] and r["replay"]["probed_values_equal"])]
    if bad:
        sys.exit(f"replay values differ from the full run's: {bad}")


if __name__ == "__main__":
    main()
