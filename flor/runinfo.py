"""Run metadata gathered at the start of a recording: versions, host, git, the command line.

Nothing here may fail a run: each probe degrades to ``None``.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = [
    "git_info", "gpus", "is_secret_name", "redact_argv", "redact_command", "redact_text", "redact_value", "script_info", "versions",
]

#: words of a flag or variable name that mark its value secret (``--hf_tok``, ``--db-password``, ``HF_TOKEN``);
#: whole words, so ``--max_tokens``, ``--tokenizer``, ``--num_passes`` and ``--author`` stay readable
_SECRET_WORDS = frozenset({
    "token", "tok", "key", "secret", "secrets", "pass", "passwd", "password", "passphrase", "pwd", "pw", "auth",
    "authorization", "bearer", "credential", "credentials", "creds", "apikey", "cookie",
})
#: endings that mark a run-together word secret (``--dbpass``, ``--hftoken``, ``--apikey``, ``--sshkey``)
_SECRET_ENDINGS = ("token", "key", "secret", "pass", "passwd", "password", "pwd", "credential", "credentials")
#: short flags whose value is hidden unless it is a plain number (``-k 5`` is a top-k, ``-k s3cr3t`` is not)
_SECRET_SHORT = frozenset({"-k", "-p"})
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")

#: secrets recognized by their shape wherever they appear: API tokens with a known prefix, JWTs
_SECRET_VALUE_RE = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"sk-[A-Za-z0-9_-]{16,}|sk_(?:live|test)_[A-Za-z0-9]{16,}|rk_live_[A-Za-z0-9]{16,}"  # OpenAI, Anthropic, Stripe
    r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}"  # GitHub, GitLab
    r"|hf_[A-Za-z0-9]{20,}|(?:AKIA|ASIA)[A-Z0-9]{16}|AIza[0-9A-Za-z_-]{35}"  # Hugging Face, AWS, Google
    r"|xox[abposr]-[A-Za-z0-9-]{10,}|xapp-[A-Za-z0-9-]{10,}"  # Slack
    r"|pypi-[A-Za-z0-9_-]{32,}|npm_[A-Za-z0-9]{30,}|wandb_v1_[A-Za-z0-9_]{20,}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"  # a JWT: header.payload.signature
    r")"
)
#: ``scheme://user:password@host``: the password is hidden, the URL kept
_URL_PASSWORD_RE = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)(?P<pw>[^@\s/]+)(?P<at>@)")
#: ``NAME=value`` words (environment assignments, ``key=value`` configs)
_ASSIGN_RE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)=(?P<value>.*)$", re.DOTALL)
_NUMBER_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
REDACTED = "***"


def is_secret_name(name: str) -> bool:
    """Whether a flag, variable or hyperparameter called ``name`` holds a secret.

    >>> [is_secret_name(n) for n in ("--hf_tok", "--db-password", "HF_TOKEN", "apiKey", "--dbpass")]
    [True, True, True, True, True]
    >>> [is_secret_name(n) for n in ("--max_tokens", "--tokenizer", "--num_passes", "--author", "--lr")]
    [False, False, False, False, False]
    """
    words = [w.lower() for w in _WORD_SPLIT.split(name) if w]
    return any(w in _SECRET_WORDS or w.endswith(_SECRET_ENDINGS) for w in words)


def redact_text(text: str) -> str:
    """``text`` with secret-shaped values hidden: known token prefixes, JWTs, URL passwords.

    >>> redact_text("postgres://u:PASS@db:5432/x")
    'postgres://u:***@db:5432/x'
    >>> redact_text("Bearer ghp_abcdefghijklmnopqrstuvwxyz0123")
    'Bearer ***'
    """
    if not isinstance(text, str):
        return text
    text = _URL_PASSWORD_RE.sub(lambda m: m["head"] + REDACTED + m["at"], text)
    return _SECRET_VALUE_RE.sub(REDACTED, text)


def redact_value(name: str, value: Any) -> Any:
    """A hyperparameter's value as it may be stored: hidden for a secret name (when set),
    secret-shaped parts of strings hidden otherwise."""
    if is_secret_name(name) and value not in (None, "", False):
        return REDACTED
    if f"-{name}" in _SECRET_SHORT and isinstance(value, str) and value and not _NUMBER_RE.match(value):
        return REDACTED  # the dest of -k/-p: as on the command line, numbers stay, words are hidden
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, list):
        return [redact_value("", v) for v in value]
    if isinstance(value, dict):
        return {k: redact_value(str(k), v) for k, v in value.items()}
    return value


def _takes_value(word: str | None) -> bool:
    """Whether ``word`` can be the value of the flag before it (not another flag)."""
    return word is not None and not (word.startswith("-") and len(word) > 1 and not _NUMBER_RE.match(word))


def redact_argv(argv: list[str]) -> list[str]:
    """The command line as flor may write it: secrets hidden by flag name and by value shape.

    ``--flag value`` and ``--flag=value`` with a secret-looking name (see ``is_secret_name``),
    ``NAME=value`` words likewise, ``-k``/``-p`` unless their value is a number, and anywhere
    a known token shape (``sk-``, ``ghp_``, ``hf_``, ``AKIA``, ``xox?-``, JWTs) or the password
    of a ``user:password@`` URL (the URL is kept).

    >>> redact_argv(["train.py", "--hf_tok", "abc", "--pwd=x", "-k", "5", "--db", "postgres://u:PW@h/db"])
    ['train.py', '--hf_tok', '***', '--pwd=***', '-k', '5', '--db', 'postgres://u:***@h/db']
    """
    out: list[str] = []
    hide_next = False
    for i, word in enumerate(argv):
        word = str(word)
        if hide_next:
            hide_next = False
            if _takes_value(word):
                out.append(REDACTED)
                continue
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if word.startswith("-") and len(word) > 1 and not _NUMBER_RE.match(word):
            flag, eq, value = word.partition("=")
            short = flag in _SECRET_SHORT
            if is_secret_name(flag.lstrip("-")) or short:
                if eq:
                    out.append(word if short and _NUMBER_RE.match(value) else f"{flag}={REDACTED}")
                else:
                    out.append(word)
                    hide_next = not (short and nxt is not None and _NUMBER_RE.match(nxt))
                continue
        else:
            m = _ASSIGN_RE.match(word)
            if m and is_secret_name(m["name"]) and m["value"]:
                out.append(f"{m['name']}={REDACTED}")
                continue
        out.append(redact_text(word))
    return out


def redact_command(command: list[str]) -> str:
    """``shlex.join`` of the redacted command: a command line that is safe to print or keep."""
    import shlex

    return shlex.join(redact_argv(list(command)))


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
#: names (of the file or of a folder above it) that hold secrets: never included, whatever the suffix
_SECRET_FILE_RE = re.compile(
    r"^(\.env.*|.*\.env|.*\.pem|.*\.key|.*\.p12|.*\.pfx|.*\.jks|.*\.keystore|.*\.kdbx|credentials?.*"
    # ssh keys (id_rsa, id_ed25519.pub...), not every id_*: id_mapping.py is source
    r"|id_(rsa|dsa|ecdsa|ed25519)(_sk)?(\..*)?|secrets?([._-].*)?|.*[._-]secrets?(\..*)?|tokens?([._-].*)?"
    r"|.*[._-]tokens?(\..*)?|\.netrc|_netrc|\.pgpass|\.npmrc|\.pypirc|\.htpasswd|\.git-credentials"
    r"|\.aws|\.ssh|\.gnupg|service[-_]?account.*)$",
    re.IGNORECASE,
)
#: a line that assigns a secret-named setting a value (``password = x``, ``api_key: x``, ``"token": "x"``)
_SECRET_LINE_RE = re.compile(
    r"""^\s*[{,]?\s*(?:export\s+)?["']?(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)["']?\s*[:=]\s*"""
    r"""(?:(?P<q>["'])(?P<quoted>[^"'\s]{4,})(?P=q)|(?P<bare>[^\s"'#$%{(<\[][^\s"'#]{3,})\s*(?:#.*)?$)""")
#: code where a bare word after ``=`` is a variable, not a value: only string literals count there
_CODE_SUFFIXES = {".py", ".pyi", ".pyx", ".ipynb", ".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh"}


def secret_file_name(rel: str) -> bool:
    """Whether a file at ``rel`` (relative path) is named like one that holds secrets.

    >>> [secret_file_name(n) for n in (".env", ".env.local", "keys/id_rsa", "secrets.yaml", "conf/prod.pem")]
    [True, True, True, True, True]
    >>> [secret_file_name(n) for n in ("train.py", "configs/model.yaml", "README.md")]
    [False, False, False]
    """
    return any(_SECRET_FILE_RE.match(part) for part in Path(rel).parts)


def holds_secret(text: str, suffix: str = "") -> bool:
    """Whether ``text`` (a file's contents) assigns a secret-named setting a literal value or
    holds a secret-shaped one (``flor.runinfo.redact_text``).

    >>> holds_secret("[db]\\npassword = hunter2\\n"), holds_secret("lr: 0.1\\nepochs: 3\\n")
    (True, False)
    >>> holds_secret("api_key = os.environ['KEY']\\n", ".py"), holds_secret("api_key = 'abcd1234'\\n", ".py")
    (False, True)
    """
    if redact_text(text) != text:
        return True
    for line in text.splitlines():
        m = _SECRET_LINE_RE.match(line)
        if m is None or not is_secret_name(m["name"]):
            continue
        value = m["quoted"] or ("" if suffix in _CODE_SUFFIXES else m["bare"] or "")
        if value and value.lower() not in ("none", "null", "true", "false", "changeme", "required"):
            return True
    return False


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
            out["gpu_memory_gb"] = [round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1) for i in range(n)]
            out["gpu_source"] = "torch"
    except Exception:  # noqa: BLE001 - metadata must never fail a run
        out = {}
    rows = _nvidia_smi("name,memory.total,compute_cap,driver_version") or _nvidia_smi("name,memory.total,driver_version")
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


def versions() -> dict[str, Any]:
    """Versions of flor, Python, NumPy, torch and CUDA, and the host; the GPUs are ``gpus()``."""
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
