"""This flor side by side with the original FLOR (pyflor 2.4.0) on one script, one interleaved run.

    python benchmarks/vs_flor.py [--rounds 5] [--epochs 6] [--quick] [--defaults]

``--defaults``: both at their default settings instead (this flor with no budget flag, pyflor
with its default epsilon 1/15), without the ``_pinned`` set; results: results/vs_flor_default.json.

Makes its own virtualenv (``python -m venv --system-site-packages``: it reuses this machine's
torch 2.13.0 CPU, then ``pip install pyflor==2.4.0``; cached in $FLOR_VS_VENV or
/tmp/flor-vs-venv). pyflor's package is also named ``flor``, so its runs go through a launcher
that drops this checkout's editable-install finder first. pyflor records only on a git branch
named ``flor.shadow*`` and commits the tree at each run: the runs happen in a temporary git
repo on such a branch, with HOME pointed at a temp folder (pyflor stores in ~/.flor).

Script: benchmarks/vs_flor_train.py, a ~70 MB checkpoint (MLP + Adam), a checkpoint at every
epoch (this flor: FLOR_EVERY=1; pyflor: epsilon 0.99, which its adaptive rule then always meets).
Per round, in turn: plain, plain with glibc's malloc thresholds raised as a flor session
raises them (``flor.malloc``: flor's checkpoints alone against it), this flor, pyflor; the
same three again with glibc's heap kept
(``PINNED``: MALLOC_TRIM_THRESHOLD_ and MALLOC_MMAP_THRESHOLD_ at 1 GiB); then an outer-loop replay
(a weight-norm log added outside the block) with each, both reading their checkpoints from the disk
(evicted from the page cache first, as days after the run). Reported: whole-process wall (median of
the rounds), overhead vs plain, peak memory (ru_maxrss of the child and its waited-for children),
minor page faults (each run's too), bytes stored, replay wall, and the median of each round's
ratios (robust to drifts of a shared machine), also this flor's recording over pyflor's directly. Results: results/vs_flor.json.

Why the other sets: with glibc's defaults the plain script page-faults ~1.4 million times in
one run (~4 s of system time on this VM) and a quarter of that in the next, because glibc
gives the top of its heap back to the kernel between training steps unless its dynamic trim
threshold has risen above a step's temporaries. pyflor raises it as a side effect (it
pickles the model's 23 MB state for timing and frees the buffer; without that pickle its runs
fault like plain's, measured 12-04), so its recordings ran at the fast end. Since 12-04 a flor
session raises the thresholds on purpose (``flor.malloc``), so this flor runs there too, and
``plain_raised`` is plain in that state. With the heap kept in all three (``_pinned``), the
allocator is out of the comparison and what remains is what each one's checkpoints cost.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import RAISED, dir_bytes, evict, median, save, table

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "vs_flor_train.py"
PYFLOR = "pyflor==2.4.0"
#: glibc keeps its heap (freed memory is not given back to the kernel between training steps)
PINNED = {"MALLOC_TRIM_THRESHOLD_": str(1 << 30), "MALLOC_MMAP_THRESHOLD_": str(1 << 30)}
RECORDS = ("plain", "flor", "pyflor")
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




def run_child(cmd: list[str], env: dict, cwd: Path) -> tuple[float, float, int, str]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = proc.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed ({proc.returncode}):\n{out[-4000:]}")
    return wall, usage.ru_maxrss / 1024, usage.ru_minflt, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="1 round, 2 epochs: a smoke test")
    ap.add_argument("--defaults", action="store_true", help="both at their default checkpoint settings")
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
        names = [*RECORDS, "plain_raised", *([] if opts.defaults else [f"{k}_pinned" for k in RECORDS]),
                 "flor_replay", "pyflor_replay"]
        kept: list[int] = []  # the epochs this flor's recordings checkpointed
        walls: dict[str, list[float]] = {k: [] for k in names}
        rss: dict[str, list[float]] = {k: [] for k in walls}
        faults: dict[str, list[int]] = {k: [] for k in walls}
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
            florenv = {**base, "FLOR_HOME": str(tmp / f"florhome{r}"), "HOME": str(home),
                       **({} if opts.defaults else {"FLOR_EVERY": "1"})}
            epsilon = [] if opts.defaults else ["0.99"]
            pyenv = {**base, "HOME": str(home)}
            plan = [("plain", [sys.executable, "train.py", *args], base),
                    ("flor", [sys.executable, "train.py", *args, "--flor", "vs"], florenv),
                    ("pyflor", [str(py), str(tmp / "launch.py"), "train.py", *args, "--flor", "vs", *epsilon], pyenv),
                    ("flor_replay", [sys.executable, "train.py", *args, "--hindsight", "--flor", "vs",
                                     "--replay_flor"], florenv),
                    ("pyflor_replay", [str(py), str(tmp / "launch.py"), "train.py", *args, "--hindsight",
                                       "--replay_flor"], pyenv)]
            if not opts.defaults:
                plan[3:3] = [(f"{name}_pinned", cmd, {**env, **PINNED}) for name, cmd, env in plan[:3]]
            # plain with glibc's thresholds raised as flor raises them (flor.malloc): flor's
            # checkpoints alone, the allocator in the same state
            plan[1:1] = [("plain_raised", [sys.executable, "-c", RAISED, "train.py", *args], base)]
            for name, cmd, env in plan:
                if name.endswith("_replay"):  # both read their checkpoints from the disk, as days after the run
                    evict(tmp / f"florhome{r}", home / ".flor")
                if name in ("flor", "flor_pinned"):
                    shutil.rmtree(tmp / f"florhome{r}", ignore_errors=True)  # each recording alone in its store
                if name in ("pyflor", "pyflor_pinned"):
                    shutil.rmtree(home / ".flor", ignore_errors=True)
                    (home / ".flor").mkdir()
                wall, peak, flt, out = run_child(cmd, env, repo)
                walls[name].append(wall)
                rss[name].append(peak)
                faults[name].append(flt)
                print(f"round {r} {name}: {wall:.2f} s, peak {peak:.0f} MiB, {flt} minor faults", flush=True)
                if name == "flor":
                    meta = json.loads(max((tmp / f"florhome{r}" / "vs" / "runs").glob("*/run.json")).read_text())
                    kept.append(len(meta["checkpoint_policy"]["checkpointed_epochs"]))
            stored["flor"].append(dir_bytes(tmp / f"florhome{r}"))
            stored["pyflor"].append(dir_bytes(home / ".flor"))
        med = {k: median(v) for k, v in walls.items()}

        def paired(key: str, base_key: str) -> float:  # the median of each round's ratio: drifts of this
            return median([a / b for a, b in zip(walls[key], walls[base_key])]) - 1  # VM hit a round's runs alike

        plain = med["plain"]
        result = {
            "quick": opts.quick, "rounds": rounds, "epochs": epochs, "steps": opts.steps, "pyflor": PYFLOR,
            "pinned_allocator_env": PINNED,
            "wall_s": walls, "median_wall_s": med, "peak_rss_mib": {k: median(v) for k, v in rss.items()},
            "minor_faults": {k: median(v) for k, v in faults.items()},
            # each run's: glibc's defaults put a run in one of two fault modes whatever the variant
            # (docs/performance.md), so the medians alone can hide which runs were compared
            "minor_faults_runs": faults,
            "record_overhead": {k: med[k] / plain - 1 for k in ("flor", "pyflor")},
            "record_overhead_paired": {k: paired(k, "plain") for k in ("flor", "pyflor")},
            "settings": "defaults" if opts.defaults else "every epoch", "flor_kept_epochs": kept,
            # against plain with glibc's thresholds raised as flor raises them (flor.malloc)
            "record_overhead_paired_raised": {k: paired(k, "plain_raised") for k in ("flor", "pyflor")},
            "plain_raised_over_plain": paired("plain_raised", "plain") + 1,
            "replay_paired_flor_over_pyflor": paired("flor_replay", "pyflor_replay") + 1,
            # this flor's recording over pyflor's, round by round: no plain run (and its fault mode) in between
            "record_paired_flor_over_pyflor": paired("flor", "pyflor") + 1,
            "stored_bytes": {k: median(v) for k, v in stored.items()},
            "replay_speedup_vs_plain": {k: plain / med[f"{k}_replay"] for k in ("flor", "pyflor")},
        }
        rows = [["plain_raised", med["plain_raised"], f"{paired('plain_raised', 'plain'):+.1%}",
                 result["peak_rss_mib"]["plain_raised"], result["minor_faults"]["plain_raised"], "", ""]]
        if not opts.defaults:
            result["record_overhead_paired_pinned"] = {k: paired(f"{k}_pinned", "plain_pinned") for k in ("flor", "pyflor")}
            result["record_paired_flor_over_pyflor_pinned"] = paired("flor_pinned", "pyflor_pinned") + 1
        for suffix in ("",) if opts.defaults else ("", "_pinned"):
            for k in RECORDS:
                name = k + suffix
                over = "" if k == "plain" else f"{paired(name, 'plain' + suffix):+.1%}"
                rows.append([name, med[name], over, result["peak_rss_mib"][name], result["minor_faults"][name],
                             "" if k == "plain" else f"{result['stored_bytes'][k] / 2**20:.0f} MiB",
                             med.get(f"{k}_replay", "") if not suffix else ""])
        print(table(rows, ["variant", "record wall s", "overhead (paired)", "peak MiB", "minor faults", "stored",
                           "replay wall s"]))
        print("against plain with glibc's thresholds raised: " + ", ".join(
            f"{k} {v:+.1%}" for k, v in result["record_overhead_paired_raised"].items()))
        print(f"record flor/pyflor {result['record_paired_flor_over_pyflor']:.3f}x paired; flor kept {kept} epochs")
        print(f"replay flor/pyflor {result['replay_paired_flor_over_pyflor']:.2f}x paired (replays read from the "
              "disk); _pinned: glibc keeps its heap (" + ", ".join(f"{k}={v}" for k, v in PINNED.items()) + ")")
        print("wrote", save("vs_flor_default" if opts.defaults else "vs_flor", result))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
