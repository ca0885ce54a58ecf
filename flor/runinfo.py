"""Run metadata gathered at the start of a recording: versions, host, git, the command line.

Nothing here may fail a run: each probe degrades to ``None``.
"""

from __future__ import annotations

import hashlib
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .redact import holds_secret, secret_file_name

__all__ = ["busy_cores", "git_info", "gpus", "process_started", "script_info", "versions"]


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


#: untracked files that count as source and go into diff.patch (data, weights, logs and
#: credential formats such as .ini, .env, .pem do not)
SOURCE_SUFFIXES = {
    ".py", ".pyi", ".pyx", ".ipynb", ".sh", ".bash", ".yaml", ".yml", ".toml", ".cfg",
    ".json", ".jsonnet", ".txt", ".md", ".rst", ".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh",
}
_UNTRACKED_MAX_FILE = 256 << 10  # bytes; bigger files are listed, not included
_UNTRACKED_MAX_TOTAL = 4 << 20
#: code where a bare word after ``=`` is a variable, not a value: only string literals count there


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
        if Path(rel).suffix.lower() not in SOURCE_SUFFIXES or not path.is_file() or path.is_symlink():
            continue
        if secret_file_name(rel):
            skipped.append(rel)  # the name says secret: never read
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
        if b"\0" in data[:8192] or holds_secret(data.decode("utf-8", errors="replace"),
                                                         Path(rel).suffix.lower()):
            skipped.append(rel)  # binary, or it holds a password or token: named, not included
            continue
        total += size
        patches.append(_new_file_patch(rel, data))
        included.append(rel)
    return "".join(patches), included, skipped


def _in_git_tree(cwd: Path) -> bool:
    """Whether ``cwd`` may be in a git work tree: a ``.git`` in it or a folder above, or ``GIT_DIR``
    set (git itself decides then).

    >>> _in_git_tree(Path("/"))
    False
    """
    if os.environ.get("GIT_DIR"):
        return True
    try:
        return any((folder / ".git").exists() for folder in (cwd.resolve(), *cwd.resolve().parents))
    except OSError:
        return True


def git_info(script: str | None, exclude: list[Path] | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """(commit, branch, dirty) of the script's git tree, and the diff when dirty.

    The diff is ``git diff HEAD`` followed by patches that create the untracked source files
    (by suffix, see ``SOURCE_SUFFIXES``; at most 256 KB each and 4 MB in all; never a file
    named like a secret, ``secret_file_name``, or holding one, ``holds_secret``: those are
    listed in ``untracked_skipped``, not included), so ``git apply``
    on a checkout of the commit gives back the code that ran. Paths under ``exclude`` (the
    store) are left out.
    """
    cwd = Path(script).parent if script and Path(script).is_file() else Path.cwd()
    if not _in_git_tree(cwd):
        return None, None  # no `git` process for a script outside any work tree
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


def gpus() -> dict[str, Any]:
    """The GPUs, without initializing CUDA: from torch where the script has (its visible
    devices), else from ``nvidia-smi`` (every GPU on the machine; ``gpu_source`` says which).
    Making CUDA's context for metadata would cost the script seconds and GPU memory, and would
    put a CUDA generator into a CPU script's random state, which its replay (that never made
    one) would then report as diverged. Runs on the recorder's writer thread: nvidia-smi takes
    ~0.1 s. Empty where there is no GPU or nothing answers."""
    out: dict[str, Any] = {}
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            n = torch.cuda.device_count()
            out["gpus"] = [torch.cuda.get_device_name(i) for i in range(n)]
            out["gpu_capabilities"] = [".".join(map(str, torch.cuda.get_device_capability(i))) for i in range(n)]
            out["gpu_memory_gb"] = [round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)
                                    for i in range(n)]
            out["gpu_source"] = "torch"
    except Exception:  # noqa: BLE001 - metadata must never fail a run
        out = {}
    rows = (_nvidia_smi("name,memory.total,compute_cap,driver_version")
            or _nvidia_smi("name,memory.total,driver_version"))
    if rows:
        out["gpu_driver"] = rows[0][-1]
        if "gpus" not in out:
            out["gpus"] = [r[0] for r in rows]
            out["gpu_memory_gb"] = [_gib(r[1]) for r in rows]
            if len(rows[0]) == 4:
                out["gpu_capabilities"] = [r[2] for r in rows]
            out["gpu_source"] = "nvidia-smi"
    return out


def _nvidia_smi(fields: str) -> list[list[str]] | None:
    text = _spawn_output(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"])
    if text is None:
        return None
    rows = [[c.strip() for c in line.split(",")] for line in text.splitlines() if line.strip()]
    n = fields.count(",") + 1
    if not rows or any(len(r) != n or not all(r) or "[" in ",".join(r) for r in rows):
        return None  # an old driver that does not know a field says "[Field not supported]"
    return rows


def _spawn_output(argv: list[str], timeout: float = 5.0) -> str | None:
    """What ``argv`` prints, or None if it is missing, fails or takes longer than ``timeout``.

    Run from the writer thread while the script's own thread may fork (a DataLoader's
    workers): a child forked while a pipe to this command is open keeps a copy of it, so
    reading the pipe to its end (``subprocess.run``'s capture, or its exec-error pipe) waits
    as long as that child lives, for ever with ``persistent_workers``. So no pipe: the output
    goes to a temporary file, the command starts with ``posix_spawn`` and is waited for by
    its pid, which no other process can hold up.
    """
    import shutil
    import tempfile

    exe = shutil.which(argv[0])
    if exe is None or not hasattr(os, "posix_spawn"):
        return None
    try:
        with tempfile.TemporaryFile() as out:
            pid = os.posix_spawn(exe, argv, os.environ, file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0), (os.POSIX_SPAWN_DUP2, out.fileno(), 1),
                (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)])
            deadline = time.monotonic() + timeout
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    return None
                time.sleep(0.01)
            if os.waitstatus_to_exitcode(status) != 0:
                return None
            out.seek(0)
            return out.read(1 << 20).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None


def _gib(mib: str) -> float | None:
    try:
        return round(float(mib) / 1024, 1)
    except ValueError:
        return None


def host_platform() -> str:
    """``platform.platform()``'s text without the ``uname -p`` process it starts (a fork of the
    training process at every recording's start): system, release, machine and C library.

    >>> host_platform().startswith(platform.system())
    True
    """
    libc, version = platform.libc_ver() if platform.system() == "Linux" else ("", "")
    return "-".join(p for p in (platform.system(), platform.release(), platform.machine()) if p) + (
        f"-with-{libc}{version}" if libc else "")


def versions() -> dict[str, Any]:
    """Versions of flor, Python, NumPy, torch and CUDA, and the host; the GPUs are ``gpus()``."""
    from ._version import __version__

    out: dict[str, Any] = {
        "flor": __version__, "python": platform.python_version(), "platform": host_platform(),
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
    except Exception:  # noqa: BLE001 - metadata must never fail a run
        out.setdefault("torch", None)
    out["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    from .malloc import done

    out["malloc"] = done()  # whether flor raised glibc's thresholds in this process (flor.malloc)
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
    """How many other processes' tasks are running or waiting for a core right now:
    ``/proc/loadavg``'s running count less this process's own running threads (this reader, and
    the OpenMP threads torch leaves spinning after its last parallel region: a recording that
    counted them read 1-2 busy cores on an idle machine, and its timings were then taken as
    slowed by that load), averaged over ``samples`` reads (the load averages lag by a minute, so
    a burst that just ended would still count); None where unknown."""
    import time

    seen = []
    for i in range(max(1, samples)):
        try:
            running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
        except (OSError, IndexError, ValueError):
            return None
        seen.append(max(0, running - own_running()))
        if i + 1 < samples:
            time.sleep(interval)
    return sum(seen) / len(seen)


def own_running() -> int:
    """This process's threads that are running or waiting for a core (state ``R`` in
    ``/proc/self/task``), at least the caller's; 1 where unknown."""
    n = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 1
    for task in tasks:
        try:
            stat = Path(f"/proc/self/task/{task}/stat").read_bytes()
        except OSError:  # the thread ended meanwhile
            continue
        n += stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] == b"R"
    return max(1, n)
