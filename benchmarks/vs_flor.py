"""This flor side by side with the original FLOR (pyflor 2.4.0) on one script, one interleaved run.

    python benchmarks/vs_flor.py [--rounds 5] [--epochs 6] [--quick]

Makes its own virtualenv (``python -m venv --system-site-packages``: it reuses this machine's
torch 2.13.0 CPU, then ``pip install pyflor==2.4.0``; cached in $FLOR_VS_VENV or
/tmp/flor-vs-venv). pyflor's package is also named ``flor``, so its runs go through a launcher
that drops this checkout's editable-install finder first. pyflor records only on a git branch
named ``flor.shadow*`` and commits the tree at each run: the runs happen in a temporary git
repo on such a branch, with HOME pointed at a temp folder (pyflor stores in ~/.flor).

Script: benchmarks/vs_flor_train.py, a ~70 MB checkpoint (MLP + Adam), a checkpoint at every
epoch (this flor: FLOR_EVERY=1; pyflor: epsilon 0.99, which its adaptive rule then always meets).
Per round, in turn: plain, this flor, pyflor; then an outer-loop replay (a weight-norm log added
outside the block) with each, both reading their checkpoints from the disk (evicted from the page
cache first, as days after the run). Reported: whole-process wall (median of the rounds), overhead vs
plain, peak memory (ru_maxrss of the child and its waited-for children), bytes stored, replay
wall, and the median of each round's ratios (robust to drifts of a shared machine). Results: results/vs_flor.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import dir_bytes, evict, median, save, table

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "vs_flor_train.py"
PYFLOR = "pyflor==2.4.0"
LAUNCH = '''import runpy, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f) and "editable" not in getattr(f, "__module__", "")]
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def venv(path: Path) -> Path:
    py = path / "bin" / "python"
    ok = py.exists() and subprocess.run([str(py), "-m", "pip", "show", "pyflor"], capture_output=True).returncode == 0
    if not ok:
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(path)], check=True)
        proc = subprocess.run([str(py), "-m", "pip", "install", "-q", PYFLOR], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"pip install {PYFLOR} failed:\n{proc.stderr[-3000:]}")
    return py




def run_child(cmd: list[str], env: dict, cwd: Path) -> tuple[float, float, str]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = proc.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed ({proc.returncode}):\n{out[-4000:]}")
    return wall, usage.ru_maxrss / 1024, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="1 round, 2 epochs: a smoke test")
    opts = ap.parse_args()
    rounds, epochs = (1, 2) if opts.quick else (opts.rounds, opts.epochs)
    tmp = Path(tempfile.mkdtemp(prefix="flor-vs-"))
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLOR_")}
    base.update(OMP_NUM_THREADS="2", PYTHONHASHSEED="0", GIT_AUTHOR_NAME="bench", GIT_AUTHOR_EMAIL="bench@localhost",
                GIT_COMMITTER_NAME="bench", GIT_COMMITTER_EMAIL="bench@localhost")
    try:
        try:
            py = venv(Path(os.environ.get("FLOR_VS_VENV", "/tmp/flor-vs-venv")))
        except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
            save("vs_flor", {"error": f"pyflor 2.4.0 could not be installed: {exc}"})
            raise SystemExit(f"pyflor unavailable: {exc}")
        (tmp / "launch.py").write_text(LAUNCH)
        args = ["--epochs", str(epochs), "--steps", str(opts.steps)]
        walls: dict[str, list[float]] = {k: [] for k in ("plain", "flor", "pyflor", "flor_replay", "pyflor_replay")}
        rss: dict[str, list[float]] = {k: [] for k in walls}
        stored: dict[str, list[int]] = {"flor": [], "pyflor": []}
        for r in range(rounds):
            repo = tmp / f"repo{r}"
            repo.mkdir()
            shutil.copy(SCRIPT, repo / "train.py")
            git = ["git", "-C", str(repo)]
            subprocess.run(git + ["init", "-q"], check=True, env=base)
            subprocess.run(git + ["checkout", "-q", "-b", "flor.shadow.bench"], check=True, env=base)
            subprocess.run(git + ["add", "-A"], check=True, env=base)
            subprocess.run(git + ["commit", "-qm", "script"], check=True, env=base)
            home = tmp / f"home{r}"
            (home / ".flor").mkdir(parents=True)
            florenv = {**base, "FLOR_HOME": str(tmp / f"florhome{r}"), "FLOR_EVERY": "1", "HOME": str(home)}
            pyenv = {**base, "HOME": str(home)}
            plan = [("plain", [sys.executable, "train.py", *args], base),
                    ("flor", [sys.executable, "train.py", *args, "--flor", "vs"], florenv),
                    ("pyflor", [str(py), str(tmp / "launch.py"), "train.py", *args, "--flor", "vs", "0.99"], pyenv),
                    ("flor_replay", [sys.executable, "train.py", *args, "--hindsight", "--flor", "vs",
                                     "--replay_flor"], florenv),
                    ("pyflor_replay", [str(py), str(tmp / "launch.py"), "train.py", *args, "--hindsight",
                                       "--replay_flor"], pyenv)]
            for name, cmd, env in plan:
                if name.endswith("_replay"):  # both read their checkpoints from the disk, as days after the run
                    evict(tmp / f"florhome{r}", home / ".flor")
                wall, peak, out = run_child(cmd, env, repo)
                walls[name].append(wall)
                rss[name].append(peak)
                print(f"round {r} {name}: {wall:.2f} s, peak {peak:.0f} MiB", flush=True)
            stored["flor"].append(dir_bytes(tmp / f"florhome{r}"))
            stored["pyflor"].append(dir_bytes(home / ".flor"))
        med = {k: median(v) for k, v in walls.items()}
        plain = med["plain"]
        result = {
            "quick": opts.quick, "rounds": rounds, "epochs": epochs, "steps": opts.steps, "pyflor": PYFLOR,
            "wall_s": walls, "median_wall_s": med, "peak_rss_mib": {k: median(v) for k, v in rss.items()},
            "record_overhead": {k: med[k] / plain - 1 for k in ("flor", "pyflor")},
            # the median of each round's ratio: drifts of this shared VM's speed hit a round's runs alike
            "record_overhead_paired": {k: median([a / b for a, b in zip(walls[k], walls["plain"])]) - 1
                                       for k in ("flor", "pyflor")},
            "replay_paired_flor_over_pyflor": median([a / b for a, b in zip(walls["flor_replay"],
                                                                             walls["pyflor_replay"])]),
            "stored_bytes": {k: median(v) for k, v in stored.items()},
            "replay_speedup_vs_plain": {k: plain / med[f"{k}_replay"] for k in ("flor", "pyflor")},
        }
        rows = [["plain", med["plain"], "", result["peak_rss_mib"]["plain"], "", ""]]
        for k in ("flor", "pyflor"):
            rows.append([k, med[k], f"{result['record_overhead'][k]:+.1%}", result["peak_rss_mib"][k],
                         f"{result['stored_bytes'][k] / 2**20:.0f} MiB", med[f"{k}_replay"]])
        print(table(rows, ["variant", "record wall s", "overhead", "peak MiB", "stored", "replay wall s"]))
        paired = result["record_overhead_paired"]
        print(f"paired per round: record overhead flor {paired['flor']:+.1%}, pyflor {paired['pyflor']:+.1%}; "
              f"replay flor/pyflor {result['replay_paired_flor_over_pyflor']:.2f}x (replays read from the disk)")
        print("wrote", save("vs_flor", result))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
