"""Run metadata gathered at the start of a recording: versions, host, git, the command line.

Nothing here may fail a run: each probe degrades to ``None``.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["git_info", "redact_argv", "script_info", "versions"]

_SECRET_RE = re.compile(r"(key|secret|token|passw|credential|auth)", re.IGNORECASE)


def redact_argv(argv: list[str]) -> list[str]:
    """The command line with the values of secret-looking flags replaced by ``***``."""
    out: list[str] = []
    hide_next = False
    for word in argv:
        if hide_next:
            out.append("***")
            hide_next = False
            continue
        if word.startswith("-") and _SECRET_RE.search(word):
            flag, eq, _ = word.partition("=")
            if eq:
                out.append(f"{flag}=***")
            else:
                out.append(word)
                hide_next = True
            continue
        out.append(word)
    return out


def script_info(argv0: str) -> dict[str, Any]:
    path = Path(argv0)
    if not argv0 or not path.is_file():
        return {"script": argv0 or None, "script_sha256": None}
    data = path.read_bytes()
    return {"script": str(path.resolve()), "script_sha256": hashlib.sha256(data).hexdigest()}


def _run_git(cwd: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=5,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def git_info(script: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """(commit, branch, dirty) of the script's git tree, and the diff when dirty."""
    cwd = Path(script).parent if script and Path(script).is_file() else Path.cwd()
    commit = _run_git(cwd, "rev-parse", "HEAD")
    if commit is None:
        return None, None
    branch = _run_git(cwd, "rev-parse", "--abbrev-ref", "HEAD")
    status = _run_git(cwd, "status", "--porcelain") or ""
    info = {"commit": commit.strip(), "branch": (branch or "").strip() or None, "dirty": bool(status.strip())}
    diff = _run_git(cwd, "diff", "HEAD") if info["dirty"] else None
    return info, diff


def versions() -> dict[str, Any]:
    from . import __version__

    out: dict[str, Any] = {
        "flor": __version__, "python": platform.python_version(), "platform": platform.platform(),
        "host": socket.gethostname(), "executable": sys.executable,
    }
    try:
        import numpy

        out["numpy"] = numpy.__version__
    except ImportError:
        out["numpy"] = None
    try:
        import torch

        out["torch"] = torch.__version__
        out["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - metadata must never fail a run
        out.setdefault("torch", None)
    out["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    return out
