"""The cost of one flor.log call while recording, in microseconds.

    python benchmarks/log_call.py [--base REV] [--quick]

Each kind of call runs in its own process (so one's background work does not land in
another's time): ``--epochs`` epochs of ``--calls`` calls each, in ``flor.it``'s loop.
Reported per kind, recording and inert:

* hot: the median over batches of 1,000 calls; what a call costs on the training thread
  between two epoch ends;
* amortized: the whole loop's wall time over the number of calls (an empty call, measured apart, included):
  also what the values cost at every epoch's end (turned into JSON lines and appended to
  the log, on the training thread) and the background work they cause (TensorBoard events
  and the best/final summary, on the writer thread, which holds the GIL the loop needs).
  The median of batches misses both: it is the figure to quote for a loop that logs a lot.

With ``--base REV`` the recordings also run with flor at git revision REV (a temporary
worktree on PYTHONPATH), interleaved kind by kind with this tree's: before/after in one run.

Results: results/log_call.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from ab_versions import REPO, worktree
from common import env, run, save, table

TARGET_US = 2.0
KINDS = {
    "float": 'flor.log("x", 0.5)',
    "float+step": 'flor.log("y", 0.5, step=i)',
    "0-d tensor": 'flor.log("z", t)',
}
SNIPPET = r"""
import json, sys, time
import torch
import flor
EPOCHS, N, B = {epochs}, {calls}, 1_000
t = torch.tensor(0.5)

def empty(i):
    return None

def call(i):
    {call}

def batches(f, n):
    per = []
    for b in range(n // B):
        t0 = time.perf_counter()
        for i in range(b * B, (b + 1) * B):
            f(i)
        per.append((time.perf_counter() - t0) / B * 1e6)
    return per

base = sorted(batches(empty, N))[N // B // 2]
per = []
t0 = time.perf_counter()
for epoch in flor.it(range(EPOCHS)):
    per += batches(call, N)
loop = time.perf_counter() - t0
per.sort()
print("RESULT " + json.dumps({{"empty": base, "hot": per[len(per) // 2], "amortized": loop / (EPOCHS * N) * 1e6}}))
"""


def measure(tmp: Path, kind: str, flags: list[str], epochs: int, calls: int, tree: Path | None = None) -> dict:
    script = tmp / f"logbench-{len(flags)}-{kind.replace(' ', '_')}.py"
    script.write_text(SNIPPET.format(epochs=epochs, calls=calls, call=KINDS[kind]))
    extra = {"PYTHONPATH": str(tree)} if tree is not None else {}
    _, proc = run([str(script), *flags], env(tmp / "home", threads=1, **extra))
    return json.loads(proc.stdout.split("RESULT ", 1)[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--calls", type=int, default=40_000, help="flor.log calls per epoch")
    ap.add_argument("--base", help="a git revision to measure beside this tree (recording only)")
    ap.add_argument("--quick", action="store_true", help="2 epochs of 5,000 calls: a smoke test")
    opts = ap.parse_args()
    epochs, calls = (2, 5_000) if opts.quick else (opts.epochs, opts.calls)
    tmp = Path(tempfile.mkdtemp(prefix="flor-bench-"))
    base_tree = worktree(opts.base, tmp / "base") if opts.base else None
    if base_tree is not None:  # the other version must not leak in
        _, which = run(["-c", "import flor; print(flor.__file__)"], env(tmp / "home", PYTHONPATH=str(base_tree)))
        if not which.stdout.strip().startswith(str(base_tree)):
            raise SystemExit(f"PYTHONPATH={base_tree} imports {which.stdout.strip()}")
    record, base = {}, {}
    try:
        for i, k in enumerate(KINDS):  # interleaved: base, this tree, next kind
            if base_tree is not None:
                base[k] = measure(tmp, k, ["--flor", f"base{i}"], epochs, calls, base_tree)
            record[k] = measure(tmp, k, ["--flor", f"logbench{i}"], epochs, calls)
        inert = {k: measure(tmp, k, [], epochs, calls) for k in KINDS}
    finally:
        if base_tree is not None:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base_tree)], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    rows = [[k, f"{record[k]['hot']:.3f}", f"{record[k]['amortized']:.3f}", f"{inert[k]['hot']:.3f}",
             f"{record[k]['empty']:.3f}"] for k in KINDS]
    print(table(rows, ["call", "record hot µs", "record amortized µs", "inert hot µs", "empty call µs"]))
    result = {"quick": opts.quick, "epochs": epochs, "calls_per_epoch": calls, "record_us": record, "inert_us": inert,
              "target_us": TARGET_US}
    if base:
        result["base"] = {"rev": opts.base, "record_us": base,
                          "ratio_hot": {k: record[k]["hot"] / base[k]["hot"] for k in KINDS},
                          "ratio_amortized": {k: record[k]["amortized"] / base[k]["amortized"] for k in KINDS}}
        print(table([[k, f"{base[k]['hot']:.3f} -> {record[k]['hot']:.3f}",
                      f"{base[k]['amortized']:.3f} -> {record[k]['amortized']:.3f}",
                      f"{result['base']['ratio_amortized'][k]:.2f}x"] for k in KINDS],
                    [f"call (base {opts.base} -> this tree)", "hot µs", "amortized µs", "amortized ratio"]))
    print(f"flor.log in record: {record['float']['amortized']:.3f} µs per call amortized "
          f"(hot {record['float']['hot']:.3f} µs); target <= {TARGET_US} µs")
    print(f"results: {save('log_call', result)}")

if __name__ == "__main__":
    main()
