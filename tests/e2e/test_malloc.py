"""flor.malloc: glibc's dynamic thresholds raised once when a session starts, so that a CPU
training step stops giving its heap back to the kernel at every step (issue #13), and left
alone where the user fixed them or asked flor not to.

Observed from glibc itself in fresh processes: ``mallinfo2().hblkhd`` (the bytes held in
``mmap``-ed blocks) grows by a 20 MiB allocation while the mmap threshold is below it (whose
free raises it to 20 MiB), then by a 24 MiB one unless flor raised it to 32 MiB in between.
"""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import Runner

PROBE = r'''
import ctypes, json, os, sys

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]

def mmapped(n):
    """Whether an n-byte allocation is served by its own mmap (at or above the mmap threshold).
    Its free raises the threshold to n (glibc's dynamic rule): each probe asks for more."""
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(n)
    grew = libc.mallinfo2().hblkhd - before
    libc.free(block)
    return grew >= n

before = mmapped(20 << 20)
if sys.argv[1] == "session":
    import flor
    from flor import runtime
    runtime.current()
    from flor.malloc import done
    said = done()
else:
    from flor.malloc import raise_thresholds
    from flor.settings import parse
    said = raise_thresholds(parse([], os.environ)[0].malloc)
print(json.dumps({"before": before, "after": mmapped(24 << 20), "said": said}))
'''


def _probe(tmp_path, how: str, **env: str) -> dict:
    runner = Runner(tmp_path)
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    args = [sys.executable, str(script), how] + (["--flor", "probe"] if how == "session" else [])
    proc = subprocess.run(args, cwd=tmp_path, env=runner.env(**env), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_session_raises_the_thresholds(tmp_path):
    out = _probe(tmp_path, "session")
    assert out == {"before": True, "after": False, "said": "glibc thresholds raised (mmap 32 MiB, trim 64 MiB)"}


def test_the_users_own_settings_are_left_alone(tmp_path):
    out = _probe(tmp_path, "direct", FLOR_MALLOC="default")
    assert out == {"before": True, "after": True, "said": "unchanged (FLOR_MALLOC=default)"}
    # a fixed trim threshold: glibc keeps its mmap threshold at 128 KiB, and flor changes nothing
    out = _probe(tmp_path, "direct", MALLOC_TRIM_THRESHOLD_="131072")
    assert out == {"before": True, "after": True, "said": "unchanged (the user's MALLOC_TRIM_THRESHOLD_)"}
    out = _probe(tmp_path, "direct", GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072")
    assert out["after"] is True and out["said"] == "unchanged (the user's GLIBC_TUNABLES)"


def test_the_run_says_what_flor_did(runner):
    runner.run(runner.script(), "--epochs", "2", "--flor", "raised")
    runner.run(runner.script(), "--epochs", "2", "--flor", "kept", env=runner.env(FLOR_MALLOC="default"))
    said = {name: json.loads(next((runner.home / name / "runs").iterdir()).joinpath("run.json").read_text())
            ["versions"]["malloc"] for name in ("raised", "kept")}
    assert said == {"raised": "glibc thresholds raised (mmap 32 MiB, trim 64 MiB)",
                    "kept": "unchanged (FLOR_MALLOC=default)"}
