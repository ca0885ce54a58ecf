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


#: untracked files that count as source and go into diff.patch (data, weights and logs do not)
SOURCE_SUFFIXES = {
    ".py", ".pyi", ".pyx", ".ipynb", ".sh", ".bash", ".yaml", ".yml", ".toml", ".cfg", ".ini",
    ".json", ".jsonnet", ".txt", ".md", ".rst", ".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh",
}
_UNTRACKED_MAX_FILE = 1 << 20  # bytes; bigger files are listed, not included
_UNTRACKED_MAX_TOTAL = 8 << 20


def _new_file_patch(rel: str, data: bytes) -> str:
    """A ``git apply``-able patch that creates ``rel`` with ``data``."""
    text = data.decode("utf-8", errors="replace")
    lines = text.splitlines(keepends=True)
    out = [f"diff --git a/{rel} b/{rel}\n", "new file mode 100644\n", "--- /dev/null\n", f"+++ b/{rel}\n"]
    if lines:
        out.append(f"@@ -0,0 +1,{len(lines)} @@\n" if len(lines) != 1 else "@@ -0,0 +1 @@\n")
        for line in lines:
            out.append("+" + line)
        if not lines[-1].endswith("\n"):
            out.append("\n\\ No newline at end of file\n")
    return "".join(out)


def _untracked(top: Path, exclude: list[Path]) -> tuple[str, list[str], list[str]]:
    """Patches creating the untracked source files; the files included and those left out."""
    listing = _run_git(top, "ls-files", "--others", "--exclude-standard", "-z") or ""
    patches, included, skipped = [], [], []
    total = 0
    for rel in sorted(f for f in listing.split("\0") if f):
        path = top / rel
        if Path(rel).suffix.lower() not in SOURCE_SUFFIXES or not path.is_file():
            continue
        if any(path.resolve().is_relative_to(e) for e in exclude):
            continue  # flor's own store, when it lives inside the repository
        try:
            size = path.stat().st_size
            if size > _UNTRACKED_MAX_FILE or total + size > _UNTRACKED_MAX_TOTAL:
                skipped.append(rel)
                continue
            data = path.read_bytes()
        except OSError:
            skipped.append(rel)
            continue
        if b"\0" in data[:8192]:
            skipped.append(rel)  # binary
            continue
        total += size
        patches.append(_new_file_patch(rel, data))
        included.append(rel)
    return "".join(patches), included, skipped


def git_info(script: str | None, exclude: list[Path] | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """(commit, branch, dirty) of the script's git tree, and the diff when dirty.

    The diff is ``git diff HEAD`` followed by patches that create the untracked source files
    (by suffix, see ``SOURCE_SUFFIXES``; at most 1 MB each and 8 MB in all), so ``git apply``
    on a checkout of the commit gives back the code that ran. Paths under ``exclude`` (the
    store) are left out.
    """
    cwd = Path(script).parent if script and Path(script).is_file() else Path.cwd()
    commit = _run_git(cwd, "rev-parse", "HEAD")
    if commit is None:
        return None, None
    branch = _run_git(cwd, "rev-parse", "--abbrev-ref", "HEAD")
    status = _run_git(cwd, "status", "--porcelain") or ""
    info: dict[str, Any] = {"commit": commit.strip(), "branch": (branch or "").strip() or None,
                            "dirty": bool(status.strip())}
    if not info["dirty"]:
        return info, None
    diff = _run_git(cwd, "diff", "HEAD") or ""
    top = (_run_git(cwd, "rev-parse", "--show-toplevel") or "").strip()
    if top:
        extra, included, skipped = _untracked(Path(top), [p.resolve() for p in exclude or []])
        diff += extra
        info["untracked_included"] = included
        if skipped:
            info["untracked_skipped"] = skipped
    return info, diff or None


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=5, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    return lines[0] if out.returncode == 0 and lines else None


def versions() -> dict[str, Any]:
    from ._version import __version__

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
        out["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        if torch.cuda.is_available():
            out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            out["gpu_capabilities"] = [".".join(map(str, torch.cuda.get_device_capability(i)))
                                       for i in range(torch.cuda.device_count())]
            out["gpu_memory_gb"] = [round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)
                                    for i in range(torch.cuda.device_count())]
            out["gpu_driver"] = _nvidia_driver()
    except Exception:  # noqa: BLE001 - metadata must never fail a run
        out.setdefault("torch", None)
    out["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    return out


def process_started() -> float | None:
    """When this process started (seconds since the epoch), from ``/proc``; None elsewhere.

    A recording keeps it so that ``flor replay --plan`` knows how long the script takes to
    reach its first epoch (interpreter, imports, data loading) before any flor call.
    """
    try:
        stat = Path(f"/proc/{os.getpid()}/stat").read_text()
        ticks = int(stat.rpartition(")")[2].split()[19])  # field 22, starttime, after the command name
        with open("/proc/stat") as fh:
            boot = next(float(line.split()[1]) for line in fh if line.startswith("btime "))
        return round(boot + ticks / os.sysconf("SC_CLK_TCK"), 3)
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def busy_cores(samples: int = 1, interval: float = 0.02) -> float | None:
    """How many other tasks are running or waiting for a core right now: ``/proc/loadavg``'s
    running count less this reader, averaged over ``samples`` reads (the load averages lag
    by a minute, so a burst that just ended would still count); None where unknown."""
    import time

    seen = []
    for i in range(max(1, samples)):
        try:
            running = Path("/proc/loadavg").read_text().split()[3].split("/")[0]
            seen.append(max(0, int(running) - 1))
        except (OSError, IndexError, ValueError):
            return None
        if i + 1 < samples:
            time.sleep(interval)
    return sum(seen) / len(seen)
