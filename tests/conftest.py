"""Shared helpers: run real scripts in subprocesses against a private FLOR_HOME."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
SCRIPTS = HERE / "scripts"
ROOT = HERE.parent


class Runner:
    """Runs scripts with ``python`` in ``cwd`` with FLOR_HOME at ``home``; one torch thread by default."""

    def __init__(self, tmp_path: Path) -> None:
        self.home = tmp_path / "florhome"
        self.cwd = tmp_path

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOR_")}
        for k in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT"):
            env.pop(k, None)
        env["FLOR_HOME"] = str(self.home)
        env["FLOR_CONFIG_DIR"] = str(self.cwd / "florconfig")  # the signing key: never the user's own
        env.setdefault("OMP_NUM_THREADS", "1")
        # toy epochs last milliseconds, so the adaptive policy would thin their checkpoints:
        # tests get a fixed schedule unless they test the policy itself
        env["FLOR_EVERY"] = "1"
        env["PYTHONHASHSEED"] = "0"
        env.update(extra)
        return env

    def script(self, name: str = "toy.py", edits: dict[str, str] | None = None, dest: str | None = None) -> Path:
        """Copy a test script into cwd, applying ``{old: new}`` text edits (each must apply)."""
        text = (SCRIPTS / name).read_text()
        for old, new in (edits or {}).items():
            assert old in text, f"edit target {old!r} not in {name}"
            text = text.replace(old, new)
        path = self.cwd / (dest or name)
        path.write_text(text)
        return path

    def run(self, script: Path, *args: str, check: bool = True, env: dict | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [sys.executable, str(script), *args], cwd=self.cwd, env=env or self.env(),
            capture_output=True, text=True, timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{script.name} {args} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def flor(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [sys.executable, "-m", "flor", *args], cwd=self.cwd, env=self.env(),
            capture_output=True, text=True, timeout=120,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"flor {args} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def logs(self, name: str, run: str | None = None) -> list[dict]:
        out = self.flor("logs", name, *(["--run", run] if run else []))
        return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]

    def tree(self) -> dict[str, bytes]:
        """Every file under FLOR_HOME with its bytes: to prove nothing was lost or changed."""
        if not self.home.exists():
            return {}
        return {str(p.relative_to(self.home)): p.read_bytes() for p in sorted(self.home.rglob("*")) if p.is_file()}


@pytest.fixture
def runner(tmp_path: Path) -> Runner:
    return Runner(tmp_path)


def values(records: list[dict], source: str | None = None) -> dict[tuple, object]:
    """{(name, epoch, step): value} of records (optionally of one source)."""
    out = {}
    for r in records:
        if source is None or r["source"] == source:
            out[(r["name"], r["epoch"], r["step"])] = r["value"]
    return out
