"""flor.runinfo asks other programs about the machine: ``git`` for the diff that recreates the
code that ran (untracked sources in, secrets out), ``nvidia-smi`` for the GPUs (never waiting
on a pipe another process holds, never making a CUDA context).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from flor.store.runmeta import FORMAT as RUN_FORMAT


def fake_run(home: Path, name: str, run: str, hp: dict, values: dict[str, list], *, status: str = "finished",
             replay: dict[str, list] | None = None) -> Path:
    """A run folder as a recording leaves it: run.json and logs (one value per epoch)."""
    d = home / name / "runs" / run
    (d / "logs").mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"name": name, "run": run, "status": status, "hyperparameters": hp,
                                            "format": RUN_FORMAT}))

    def lines(vals: dict[str, list], t0: float) -> str:
        return "".join(json.dumps({"name": n, "value": v, "epoch": e, "step": None, "block": None, "t": t0 + e}) + "\n"
                       for n, vs in vals.items() for e, v in enumerate(vs))

    (d / "logs" / "record.jsonl").write_text(lines(values, 0))
    if replay:
        (d / "logs" / "replay-r1-0.jsonl").write_text(lines(replay, 100))
    return d


@pytest.fixture
def store(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    fake_run(home, "sw", "r1", {"lr": 0.1, "seed": 0}, {"loss": [3.0, 2.0, 1.0]})
    fake_run(home, "sw", "r2", {"lr": 0.1, "seed": 1}, {"loss": [3.0, 1.5, 2.0]})
    fake_run(home, "sw", "r3", {"lr": 0.5, "seed": 0}, {"loss": [4.0, 0.5, 0.7]},
             replay={"loss": [4.0, 0.5, 0.6], "gnorm": [9.0, 8.0, 7.0]})
    fake_run(home, "sw", "r4", {"lr": 0.5, "seed": 1}, {"loss": [4.0, 0.9]}, status="crashed")
    return home


# -- git metadata ---------------------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_diff_patch_includes_untracked_sources(tmp_path):
    from flor.runinfo import git_info

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.email=a@b", "-c", "user.name=t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "train.py").write_text("print(1)\n")
    git("add", ".")
    git("commit", "-qm", "init")
    (tmp_path / "train.py").write_text("print(2)\n")
    (tmp_path / "helper.py").write_text("X = 1")  # no final newline
    (tmp_path / "weights.bin").write_bytes(b"\0" * 10)
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "run.json").write_text("{}")
    info, diff = git_info(str(tmp_path / "train.py"), exclude=[tmp_path / "store"])
    assert info["dirty"] and info["untracked_included"] == ["helper.py"]
    assert "+print(2)" in diff and "+++ b/helper.py" in diff and "weights.bin" not in diff
    patch = tmp_path.parent / "p.patch"
    patch.write_text(diff)
    git("stash", "-u", "-q")
    git("apply", str(patch))  # the patch recreates the code that ran
    assert (tmp_path / "helper.py").read_text() == "X = 1" and (tmp_path / "train.py").read_text() == "print(2)\n"


def test_gpu_query_never_waits_on_a_pipe_another_process_holds(monkeypatch, tmp_path):
    """The GPU query runs on the writer thread while the script forks (a DataLoader's
    persistent workers): a child forked while a pipe to nvidia-smi was open kept a copy, and
    reading the pipe to its end hung the writer for the whole run (its checkpoints were all
    abandoned at exit). Here nvidia-smi itself leaves such a process behind, holding its
    stdout for 30 s: the answer comes when nvidia-smi exits, not when its stdout closes."""
    import os
    import signal
    import time

    from flor.runinfo import gpus

    folder = tmp_path / "bin"
    folder.mkdir()
    smi = folder / "nvidia-smi"
    held = tmp_path / "held.pid"
    smi.write_text(f'#!/bin/sh\necho "NVIDIA H200, 143771, 9.0, 580.159.03"\nsleep 30 &\necho $! > {held}\nexit 0\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    t0 = time.monotonic()
    found = gpus()
    took = time.monotonic() - t0
    os.kill(int(held.read_text()), signal.SIGKILL)
    assert found.get("gpus") == ["NVIDIA H200"], found
    assert took < 4, took  # subprocess.run's capture waited out its 5 s timeout and found nothing
    smi.write_text("#!/bin/sh\nexec sleep 30\n")  # hangs: given up after the timeout, killed
    from flor.runinfo import _spawn_output

    t0 = time.monotonic()
    assert _spawn_output(["nvidia-smi"], timeout=0.3) is None and time.monotonic() - t0 < 3


def test_gpu_facts_never_make_a_cuda_context(monkeypatch, tmp_path):
    """run.json's GPUs come from torch only where the script has made CUDA's context, else from
    nvidia-smi (a real program on PATH here): flor making the context would put a CUDA
    generator into a CPU script's recorded random state, and its probed replay, which never
    makes one, reported every block diverged (seen on a GPU machine). Older drivers that do
    not know a field are asked again without it."""
    import os

    import torch

    from flor.runinfo import gpus, versions

    touched: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    for name in ("get_device_name", "get_device_capability", "get_device_properties", "init", "_lazy_init"):
        monkeypatch.setattr(torch.cuda, name, lambda *args, _name=name: touched.append(_name))
    folder = tmp_path / "bin"
    folder.mkdir()
    smi = folder / "nvidia-smi"
    smi.write_text('#!/bin/sh\ncase "$1" in *compute_cap*) echo "NVIDIA H200, 143771, 9.0, 580.159.03";; esac\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    assert not {"gpus", "gpu_driver"} & set(versions())
    assert gpus() == {"gpus": ["NVIDIA H200"], "gpu_memory_gb": [140.4], "gpu_capabilities": ["9.0"],
                      "gpu_driver": "580.159.03", "gpu_source": "nvidia-smi"}
    smi.write_text('#!/bin/sh\ncase "$1" in *compute_cap*) echo "A100, 40960, [Field not supported], 470.1";;'
                   ' *) echo "A100, 40960, 470.1";; esac\n')
    assert gpus() == {"gpus": ["A100"], "gpu_memory_gb": [40.0], "gpu_driver": "470.1", "gpu_source": "nvidia-smi"}
    assert touched == []
    smi.unlink()
    assert gpus() == {}


@pytest.mark.parametrize("name, text, included", [
    ("helper.py", "WIDTH = 24\napi_key = os.environ['KEY']\n", True),
    ("configs/model.yaml", "lr: 0.1\nmax_tokens: 512\n", True),
    ("configs/prod.yaml", "db:\n  password: hunter2hunter\n", False),
    ("secrets.yaml", "lr: 0.1\n", False),
    ("keys/server.pem", "x\n", False),
    ("conf.py", "TOKEN = 'abcdefgh12'\n", False),
    ("config.ini", "[x]\nlr = 1\n", False),  # .ini is not a source suffix
    ("big.py", "BIG", False),  # over 256 KB
], ids=lambda v: v if isinstance(v, str) and len(v) < 24 and "\n" not in v else "")
def test_untracked_files_enter_the_diff_only_when_source_and_not_secret(tmp_path: Path, name: str, text: str,
                                                                      included: bool) -> None:
    if shutil.which("git") is None:
        pytest.skip("needs git")
    from flor.runinfo import git_info

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.email=a@b", "-c", "user.name=t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "train.py").write_text("print(1)\n")
    git("add", ".")
    git("commit", "-qm", "init")
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text("x = 1\n" * 60_000 if text == "BIG" else text)
    info, diff = git_info(str(tmp_path / "train.py"))
    assert (name in info.get("untracked_included", [])) == included
    assert (f"+++ b/{name}" in (diff or "")) == included
