"""The cost of one flor.log call while recording, in microseconds (median over batches).

    python benchmarks/log_call.py
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from common import env, run, save, table

SNIPPET = r"""
import json, sys, time
import torch
import flor
N, B = 200_000, 1_000
t = torch.tensor(0.5)
out = {}
for epoch in flor.it(range(1)):
    for label, call in (("float", lambda i: flor.log("x", 0.5)),
                        ("float+step", lambda i: flor.log("y", 0.5, step=i)),
                        ("0-d tensor", lambda i: flor.log("z", t)),
                        ("baseline: empty call", lambda i: None)):
        per = []
        for b in range(N // B):
            t0 = time.perf_counter()
            for i in range(B):
                call(i)
            per.append((time.perf_counter() - t0) / B * 1e6)
        per.sort()
        out[label] = per[len(per) // 2]
print("RESULT " + json.dumps(out))
"""


def measure(tmp: Path, flags: list[str]) -> dict:
    script = tmp / "logbench.py"
    script.write_text(SNIPPET)
    _, proc = run([str(script), *flags], env(tmp / "home", threads=1))
    return json.loads(proc.stdout.split("RESULT ", 1)[1])


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="flor-bench-"))
    try:
        record = measure(tmp, ["--flor", "logbench"])
        inert = measure(tmp, [])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = [[k, f"{record[k]:.3f}", f"{inert[k]:.3f}"] for k in record]
    print(table(rows, ["call", "record µs (median)", "inert µs (median)"]))
    net = record["float"] - record["baseline: empty call"]
    print(f"flor.log in record: {record['float']:.3f} µs per call ({net:.3f} µs above an empty Python call)")
    print(f"results: {save('log_call', {'record_us': record, 'inert_us': inert, 'target_us': 2.0})}")


if __name__ == "__main__":
    main()
