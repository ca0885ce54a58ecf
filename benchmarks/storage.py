"""Storage: bytes on disk per epoch vs the raw state size, and a fine-tuning run with a frozen
backbone, whose frozen tensors must be stored once (target <= 1.05 x (frozen once +
trainable x epochs)).

    python benchmarks/storage.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from common import TRAIN, dir_bytes, env, latest_run, run, save, table


def leaf_bytes(node, out: dict) -> dict:
    """{hash: bytes} of the tensor and array leaves in a manifest tree."""
    if isinstance(node, dict):
        if node.get("t") in ("tensor", "ndarray") and "h" in node:
            itemsize = (np.dtype(node["dtype"]).itemsize if node["t"] == "ndarray"
                        else torch.empty((), dtype=getattr(torch, node["dtype"])).element_size())
            out[node["h"]] = math.prod(node["shape"]) * itemsize
        for v in node.values():
            leaf_bytes(v, out)
    elif isinstance(node, list):
        for v in node:
            leaf_bytes(v, out)
    return out


def measure(tmp: Path, model: str, margs: list[str]) -> dict:
    home = tmp / model
    run([str(TRAIN), "--model", model, *margs, "--flor", "bench"], env(home, FLOR_EVERY="1"))
    run_dir = latest_run(home, "bench")
    manifests = sorted((run_dir / "checkpoints" / "train").glob("*.json"), key=lambda p: int(p.stem))
    per_epoch = [leaf_bytes(json.loads(p.read_text())["objects"], {}) for p in manifests]
    raw_per_epoch = sum(per_epoch[0].values())
    objects = dir_bytes(home / "bench" / "objects")
    result = {"epochs": len(manifests), "raw_state_bytes_per_epoch": raw_per_epoch,
              "stored_bytes": objects, "stored_per_epoch": objects / len(manifests),
              "stored_over_raw": objects / (raw_per_epoch * len(manifests))}
    if model == "finetune":
        # frozen: the leaves that are the same in every epoch; trainable: the rest
        frozen = set(per_epoch[0]).intersection(*per_epoch[1:])
        frozen_bytes = sum(per_epoch[0][h] for h in frozen)
        trainable = [sum(b for h, b in e.items() if h not in frozen) for e in per_epoch]
        bound = frozen_bytes + sum(trainable)
        result.update({"frozen_bytes": frozen_bytes, "trainable_bytes_per_epoch": sum(trainable) / len(trainable),
                       "ideal_bytes": bound, "stored_over_ideal": objects / bound, "target": 1.05})
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    opts = ap.parse_args()
    margs = ["--epochs", "3" if opts.quick else "5", "--steps", "2", "--batch", "16"]
    tmp = Path(tempfile.mkdtemp(prefix="flor-bench-"))
    try:
        full = measure(tmp, "big", margs)
        tune = measure(tmp, "finetune", margs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    mb = 1e6
    print(table([
        ["big (all trained)", f"{full['raw_state_bytes_per_epoch'] / mb:.1f} MB", f"{full['stored_per_epoch'] / mb:.1f} MB",
         f"{full['stored_over_raw']:.3f}", "-"],
        ["finetune (frozen body)", f"{tune['raw_state_bytes_per_epoch'] / mb:.1f} MB", f"{tune['stored_per_epoch'] / mb:.1f} MB",
         f"{tune['stored_over_raw']:.3f}", f"{tune['stored_over_ideal']:.3f} (target <= 1.05)"],
    ], ["run", "raw state/epoch", "stored/epoch", "stored/raw", "stored/(frozen once + trainable x epochs)"]))
    print(f"results: {save('storage', {'args': margs, 'big': full, 'finetune': tune})}")


if __name__ == "__main__":
    main()
