"""What every benchmark shares: running scripts, timing them, describing the machine, saving results."""

from __future__ import annotations

import compileall
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
TRAIN = HERE / "bench_train.py"

# flor's bytecode written before anything is timed, as ``pip install`` writes it for an installed
# package: with PYTHONDONTWRITEBYTECODE set (this project's machines set it) a checkout's flor would
# be compiled again by every process measured (~90 ms each, counted as flor's start-up)
compileall.compile_dir(HERE.parent / "flor", quiet=2)


def machine() -> dict[str, Any]:
    """The machine the numbers come from."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        mem = round(int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1)) / 2**20, 1)
    except (OSError, AttributeError):
        pass
    import torch

    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem, "python": platform.python_version(),
            "torch": torch.__version__, "platform": platform.platform(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def env(home: Path, threads: int = 2, **extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("FLOR_")}
    e.update({"FLOR_HOME": str(home), "OMP_NUM_THREADS": str(threads), "PYTHONHASHSEED": "0"})
    e.update(extra)
    return e


def run(args: list[str], env: dict[str, str], cwd: Path | None = None) -> tuple[float, subprocess.CompletedProcess]:
    """Run ``python ARGS``; return its wall time and the finished process (which must succeed)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{args} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return wall, proc


def loop_seconds(proc: subprocess.CompletedProcess) -> float:
    return float(re.search(r"LOOP_SECONDS ([\d.]+)", proc.stdout).group(1))


def latest_run(home: Path, name: str) -> Path:
    return sorted((home / name / "runs").iterdir())[-1]


def run_meta(home: Path, name: str) -> dict:
    return json.loads((latest_run(home, name) / "run.json").read_text())


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def dir_bytes(path: Path) -> int:
    from flor.store.experiment import dir_size

    return dir_size(path)


def evict(*folders: Path) -> None:
    """Write back everything, then drop the files under ``folders`` from the page cache, as
    days after a run: what a replay (or a raw read probe) reads then comes from the disk.
    Needs no root (``posix_fadvise(DONTNEED)`` on each file); a no-op where unsupported."""
    os.sync()
    for folder in folders:
        for path in Path(folder).rglob("*"):
            try:
                if not path.is_file() or path.is_symlink():
                    continue
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
            except (OSError, AttributeError):
                pass


def save(name: str, result: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": name, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(), **result}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path


def save_unless_quick(name: str, result: dict[str, Any], quick: bool) -> None:
    """Save ``result`` as results/NAME.json, but for a smoke test (``quick``), which only prints it:
    a smoke test never replaces the committed figures."""
    print(json.dumps(result, indent=1) if quick else f"results: {save(name, result)}")


def table(rows: list[list[Any]], header: list[str]) -> str:
    cells = [header] + [[f"{c:.4g}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


#: the variants the overhead benchmarks interleave: no flor; no flor with glibc's malloc
#: thresholds raised as a flor session raises them (flor.malloc), so that the checkpoints'
#: cost is measured apart from that; flor at the default budget; flor every epoch
VARIANTS = ("plain", "plain_raised", "flor", "flor_every")
#: ``python -c RAISED SCRIPT ARGS...``: SCRIPT run as plain, after flor.malloc's one malloc and free
RAISED = ("import runpy, sys; from flor.malloc import raise_thresholds; raise_thresholds(); "
          "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def command(variant: str, args: list[str], name: str) -> list[str]:
    """``python``'s arguments for ``args`` run as ``variant``: plain, plain_raised (after
    flor.malloc's one malloc and free) or, for any other variant, recorded as ``--flor NAME``."""
    if variant == "plain_raised":
        return ["-c", RAISED, *args]
    return args if variant == "plain" else [*args, "--flor", name]


def overheads(times: dict[str, list[float]], loops: dict[str, list[float]]) -> dict[str, float]:
    """flor's overheads at the default budget and every epoch, end to end and in the loop, the
    median over rounds of each interleaved pair's ratio: against plain, and (``*_vs_raised``)
    against plain with glibc's thresholds raised as flor raises them."""
    out = {}
    for base, suffix in (("plain", ""), ("plain_raised", "_vs_raised")):
        for variant, name in (("flor", "default"), ("flor_every", "every_epoch")):
            out[f"overhead_{name}{suffix}"] = median([f / p for f, p in zip(times[variant], times[base])]) - 1
            out[f"loop_overhead_{name}{suffix}"] = median([f / p for f, p in zip(loops[variant], loops[base])]) - 1
    return out


def interleaved(args: list[str], rounds: int, tmp: Path, tag: str, keep_last: bool = False,
                **extra: str) -> tuple[dict, dict, dict, list[float]]:
    """Run ``python ARGS --memcpy-probe`` (bench_train.py) as each of ``VARIANTS``, ``rounds``
    times in turn, so that drifts in machine speed hit all variants alike; ``extra`` goes into
    every run's environment. Returns each variant's wall times, loop times and (flor's) run.json
    contents, and each every-epoch run's MEMCPY_GBPS. Stores go under ``tmp/TAG-VARIANT-ROUND``
    and are removed, but for the last every-epoch one where ``keep_last``."""
    times: dict[str, list[float]] = {k: [] for k in VARIANTS}
    loops: dict[str, list[float]] = {k: [] for k in VARIANTS}
    metas: dict[str, list[dict]] = {"flor": [], "flor_every": []}
    memcpy: list[float] = []
    for rnd in range(rounds):
        for variant in VARIANTS:
            home = tmp / f"{tag}-{variant}-{rnd}"
            every = {"FLOR_EVERY": "1"} if variant == "flor_every" else {}
            wall, proc = run([*command(variant, args, "bench"), "--memcpy-probe"], env(home, **extra, **every))
            times[variant].append(wall)
            loops[variant].append(loop_seconds(proc))
            if variant == "flor_every":
                memcpy.append(float(re.search(r"MEMCPY_GBPS ([\d.]+)", proc.stdout).group(1)))
            if variant in metas:
                metas[variant].append(run_meta(home, "bench"))
            if not (keep_last and variant == "flor_every" and rnd == rounds - 1):
                shutil.rmtree(home, ignore_errors=True)
    return times, loops, metas, memcpy
