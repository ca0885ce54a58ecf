"""Replay speedup: an outer-loop-only hindsight log replayed from checkpoints vs re-training
the edited script from scratch, beside the ideal speedup and the disk's raw read bandwidth.

The ideal: epoch time / (restore time + outer-loop time), both epoch and outer loop timed on a
recording of the script with the hindsight log (its work runs in the replay too); replays and
raw reads start from an evicted page cache, as days after the run. The replay runs
``--rounds`` times (this VM's disk reads vary several-fold from minute to minute); each round's
fraction of the ideal uses its own restore time, and the median round is quoted.

    python benchmarks/replay_speedup.py [--quick] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from common import TRAIN, env, evict, latest_run, loop_seconds, run, run_meta, save, table


def raw_read_gbps(paths: list[Path]) -> float:
    """Plain sequential reads of the same files, in the same run: the bound replay reads against."""
    total, t0 = 0, time.perf_counter()
    for p in paths:
        total += len(p.read_bytes())  # one read per file: no parsing, no hashing, no copying
    return total / (time.perf_counter() - t0) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3, help="replays, each from an evicted page cache; the median is quoted")
    opts = ap.parse_args()
    margs = (["--model", "cnn", "--epochs", "3", "--steps", "5"] if opts.quick
             else ["--model", "big", "--epochs", "6", "--steps", "12", "--batch", "32"])
    tmp = Path(tempfile.mkdtemp(prefix="flor-bench-"))
    try:
        home = tmp / "home"
        e = env(home, FLOR_EVERY="1")
        run([str(TRAIN), *margs, "--flor", "bench"], e)
        meta = run_meta(home, "bench")
        # the edited script, from scratch: what a user without flor would do
        retrain_s, retrain = run([str(TRAIN), *margs, "--hindsight"], env(tmp / "unused"))
        # the epoch and outer-loop times of the script WITH the hindsight log (it runs in the replay
        # too), from a recording of it: what the ideal replay still pays is restore + that outer loop
        run([str(TRAIN), *margs, "--hindsight", "--flor", "timing"], env(tmp / "timing", FLOR_EVERY="1"))
        hind = run_meta(tmp / "timing", "timing")
        blobs = [p for p in (home / "bench" / "objects").rglob("*") if p.is_file()]
        rounds = []
        for _ in range(opts.rounds):  # this VM's disk reads vary several-fold from minute to minute
            evict(home)  # read from the disk, as days after the run (the raw probe below reads the same way)
            replay_s, replay = run([str(TRAIN), *margs, "--hindsight", "--flor", "bench", "--replay_flor"], e)
            assert "replay verified exact" in replay.stderr, replay.stderr[-2000:]
            summary = json.loads(sorted((latest_run(home, "bench") / "logs").glob("replay-*.summary.json"),
                                        key=lambda p: p.stat().st_mtime)[-1].read_text())
            rounds.append((replay_s, replay, summary["io"]))
        raws = []
        for _ in range(2):
            evict(home)  # the same page cache state as the replay's reads
            raws.append(raw_read_gbps(blobs))
        raw = max(raws)
        epochs = meta["epochs_done"]
        epoch_s = sum(hind["timings"]["epoch_s"]) / epochs
        block_s = sum(hind["timings"]["blocks"]["train"]) / epochs
        outer_s = epoch_s - block_s
        # the definition before 2026-12-02 took both times from the recording WITHOUT the hindsight log
        plain_epoch_s = sum(meta["timings"]["epoch_s"]) / epochs
        plain_outer_s = plain_epoch_s - sum(meta["timings"]["blocks"]["train"]) / epochs
        per_round = []
        for replay_s, replay, io in rounds:
            restore_s = (io["load_s"] + io["restore_s"]) / epochs
            ideal = epoch_s / (restore_s + outer_s)
            loop_speedup = loop_seconds(retrain) / loop_seconds(replay)
            per_round.append({
                "replay_s": replay_s, "speedup_in_loop": loop_speedup, "ideal_speedup": ideal,
                "fraction_of_ideal": loop_speedup / ideal, "restore_s_per_epoch": restore_s,
                "ideal_without_hindsight_work": plain_epoch_s / (restore_s + plain_outer_s),
                "replay_read_gbps": io["restore_bytes"] / io["load_s"] / 1e9 if io["load_s"] else float("nan"),
                "restore_bytes": io["restore_bytes"],
            })
        mid = sorted(per_round, key=lambda r: r["fraction_of_ideal"])[len(per_round) // 2]  # the median round
        replay_s, loop_speedup, ideal, read_gbps = (mid["replay_s"], mid["speedup_in_loop"], mid["ideal_speedup"],
                                                    mid["replay_read_gbps"])
        result = {
            "args": margs, "epochs": epochs, "rounds": opts.rounds, "retrain_s": retrain_s, "replay_s": replay_s,
            "speedup_end_to_end": retrain_s / replay_s, "speedup_in_loop": loop_speedup, "ideal_speedup": ideal,
            "fraction_of_ideal": mid["fraction_of_ideal"],
            "fraction_of_ideal_rounds": [r["fraction_of_ideal"] for r in per_round],
            "ideal_without_hindsight_work": mid["ideal_without_hindsight_work"], "epoch_s": epoch_s,
            "outer_loop_s": outer_s, "restore_s_per_epoch": mid["restore_s_per_epoch"],
            "restore_bytes": mid["restore_bytes"], "replay_read_gbps": read_gbps, "raw_read_gbps": raw,
            "read_fraction_of_raw": read_gbps / raw, "round_details": per_round,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(table([[f"{result['speedup_end_to_end']:.2f}x", f"{loop_speedup:.2f}x", f"{ideal:.2f}x",
                  f"{result['fraction_of_ideal']:.0%}", f"{read_gbps:.2f}", f"{raw:.2f}",
                  f"{result['read_fraction_of_raw']:.0%}"]],
                ["speedup end-to-end", "speedup in loop", "ideal", "of ideal", "replay read GB/s",
                 "raw read GB/s", "of raw"]))
    print(f"results: {save('replay_speedup', result)}")


if __name__ == "__main__":
    main()
